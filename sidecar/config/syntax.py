"""What the text keys of the configuration must look like: URLs (host, port, IPv6 brackets), host names, HTTP
header names and values, origins, URL paths. Each check raises ValueError saying what is wrong, so a mistake is
a configuration error naming its key when the file loads, not a traceback (or a silently broken request) later.

A URL may hold a password: no message here echoes a whole URL, only the part found wrong.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

__all__ = [
    "check_header_name",
    "check_header_value",
    "check_host",
    "check_http_url",
    "check_netloc",
    "check_origin",
    "check_url_path",
]

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""An HTTP token (RFC 9110 §5.6.2): what a header name is made of."""
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?")
"""A DNS name: dot-separated labels of letters, digits, hyphens (and underscores, seen in internal names)."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_BUT_TAB = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _shown(char: str) -> str:
    return repr(char)[1:-1]


def check_host(host: str) -> None:
    """A host name or an IP address (an IPv6 one without brackets), as a listener binds or a URL names."""
    if not host:
        raise ValueError("the host is empty")
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    if "://" in host or "/" in host:
        raise ValueError(f"{host!r} is not a host name (a host only: no scheme, no path)")
    if ":" in host:
        if host.startswith("[") or host.count(":") > 1:
            raise ValueError(f"{host!r} is not an IPv6 address (written without brackets here)")
        raise ValueError(f"{host!r} is not a host name (the port is a key of its own)")
    try:
        ascii_host = host.encode("idna").decode("ascii")
    except UnicodeError:
        raise ValueError(f"{host!r} is not a valid host name") from None
    if not _HOST_NAME.fullmatch(ascii_host):
        raise ValueError(f"{host!r} is not a valid host name")


def check_netloc(netloc: str, *, port_required: bool = False) -> None:
    """`[user[:password]@]host[:port]` of a URL: a host, a bracketed IPv6 address that is one, a port 1-65535."""
    hostport = netloc.rpartition("@")[2]
    if hostport.startswith("["):
        address, closed, rest = hostport[1:].partition("]")
        if not closed:
            raise ValueError("the IPv6 address has no closing ']'")
        try:
            ipaddress.IPv6Address(address.split("%", 1)[0])
        except ValueError:
            raise ValueError(f"[{address}] is not an IPv6 address") from None
        if rest and not rest.startswith(":"):
            raise ValueError(f"unexpected {rest!r} after the IPv6 address (a port is written ]:port)")
        host, port = address, rest[1:] if rest else None
    else:
        host, sep, after = hostport.rpartition(":")
        host, port = (host, after) if sep else (hostport, None)
        if any(char in host for char in "[]:"):
            raise ValueError("an IPv6 address must be written in brackets, [::1]")
        if not host:
            raise ValueError("there is no host")
        check_host(host)
    if port is None or port == "":
        if port_required:
            raise ValueError("there is no port (host:port)")
        return
    if not port.isdigit():
        raise ValueError(f"the port {port!r} is not a number")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"the port {int(port)} is out of range (1-65535)")


def check_http_url(url: str, purpose: str = "") -> None:
    """An absolute http:// or https:// URL with a host that can be connected to."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise ValueError("must be an http:// or https:// URL" + (f" ({purpose})" if purpose else ""))
    if _CONTROL.search(url) or " " in url:
        raise ValueError("must not contain spaces or control characters")
    netloc = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    if not netloc.rpartition("@")[2]:
        raise ValueError("has no host (http://host[:port]/path)")
    check_netloc(netloc)
    try:
        urlsplit(url).port  # noqa: B018  (what the HTTP client will parse: it must agree)
    except ValueError as exc:
        raise ValueError(str(exc)) from None


def check_origin(origin: str) -> None:
    """A browser Origin header value as sent: scheme://host[:port], nothing after it."""
    if _CONTROL.search(origin) or " " in origin:
        raise ValueError(f"origin {origin!r} must not contain spaces or control characters")
    scheme, sep, netloc = origin.partition("://")
    if not sep or not scheme:
        raise ValueError(f"origin {origin!r} is not scheme://host[:port] (https://app.example.com)")
    if any(char in netloc for char in "/?#"):
        raise ValueError(f"origin {origin!r} has a path; a browser sends scheme://host[:port] only, no trailing '/'")
    try:
        check_netloc(netloc)
    except ValueError as exc:
        raise ValueError(f"origin {origin!r}: {exc}") from None


def check_header_name(name: str) -> None:
    if not _TOKEN.fullmatch(name):
        bad = next((char for char in name if not _TOKEN.fullmatch(char)), "")
        what = f"holds '{_shown(bad)}'" if bad else "is empty"
        raise ValueError(f"header name '{_shown(name)}' {what}: a name is letters, digits and !#$%&'*+-.^_`|~")


def check_header_value(name: str, value: str) -> None:
    """No line break or other control character (a tab is allowed): one would split the request's head."""
    if bad := _CONTROL_BUT_TAB.search(value):
        raise ValueError(f"the value of header {name!r} holds a control character ('{_shown(bad.group())}')")


def check_url_path(path: str) -> None:
    """A fixed path served by a listener: '/...', no spaces, no query, no route pattern."""
    if not path.startswith("/"):
        raise ValueError("must start with '/'")
    if bad := re.search(r"[\s\x00-\x1f\x7f?#{}]", path):
        raise ValueError(f"must not contain '{_shown(bad.group())}' (a fixed path: no query, fragment or pattern)")
