"""The effective configuration as it may be shown (`check-config`, the configuration log line): every value as it
is, except the secrets: header and environment values, and a URL's password or credential query parameters.

A password-less URL is shown whole: an operator reading `redis://db:6379/0` learns where the bus is, and a
mask there would hide the one thing worth checking."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sidecar.config import SidecarConfig

__all__ = ["MASK", "masked_url", "shown_config"]

MASK = "***"
_NETLOC_END = re.compile(r"[/?#]")
_SECRET_PARAMETER = re.compile(r"pass|token|secret|key|auth|sig", re.IGNORECASE)
"""Query parameters whose value is a credential (`?password=`, `?api_key=`, `?token=`, `?sig=`)."""
_TOKEN_AS_USER_SCHEMES = ("http", "https")
"""Where a user without a password is a token; in a Redis URL it is an ACL user's name, shown."""


def masked_url(url: str) -> str:
    """`url` with the password of its `user:password@` (an HTTP URL's lone `token@` too) and the values of
    credential query parameters masked.

    Written for every URL the configuration holds, a Redis Cluster's `host:port,host:port` seed list included
    (which the standard library's URL parser refuses), so it splits the text itself."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        return url
    end = _NETLOC_END.search(rest)
    netloc, tail = (rest[: end.start()], rest[end.start() :]) if end else (rest, "")
    userinfo, at, hosts = netloc.rpartition("@")
    if at:
        user, colon, _password = userinfo.partition(":")
        if colon:
            netloc = f"{user}:{MASK}@{hosts}"
        elif scheme.lower() in _TOKEN_AS_USER_SCHEMES:
            netloc = f"{MASK}@{hosts}"  # `https://TOKEN@host`: a lone user of an HTTP URL is a credential
    path, question, query = tail.partition("?")
    if question:
        query, hash_mark, fragment = query.partition("#")
        query = "&".join(_masked_parameter(pair) for pair in query.split("&")) + hash_mark + fragment
    return f"{scheme}://{netloc}{path}{question}{query}"


def _masked_parameter(pair: str) -> str:
    name, equals, value = pair.partition("=")
    return f"{name}={MASK}" if equals and value and _SECRET_PARAMETER.search(name) else pair


def shown_config(config: SidecarConfig) -> dict[str, Any]:
    """The whole configuration as plain JSON data, secrets masked (see the module's docstring)."""
    shown = config.model_dump(mode="json")  # SecretStr values (headers, env) dump as asterisks
    upstream = shown["upstream"]
    for key in ("url", "public_url"):
        if upstream.get(key):
            upstream[key] = masked_url(upstream[key])
    shown["bus"]["redis_url"] = masked_url(config.bus.redis_url.get_secret_value())
    if shown["tracing"].get("endpoint"):
        shown["tracing"]["endpoint"] = masked_url(shown["tracing"]["endpoint"])
    return shown
