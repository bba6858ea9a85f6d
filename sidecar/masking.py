"""The one masking rule: what of a credential the operator gave may be shown, on any surface (the client listener,
the admin listener, a log line, a span, `check-config`).

Two halves. By shape, for text the sidecar writes itself: `masked_url` (a URL's password, an HTTP URL's whole
userinfo, credential query parameters), `masked_command` (those inside a stdio command's arguments, and the value
of an argument named like a credential) and `shown_upstream` (the upstream, HTTP or stdio, as every surface names
it). By value, for text that comes from outside (a child's stderr, a library's exception): `secret_values` finds the
credential values (header and `env` values, URL passwords and credential parameters, in a command too; the
configuration's are `config.shown.secrets_in`), `remember_secrets` keeps them, and `scrub` replaces any of them
wherever it appears; the log handler scrubs every line it writes, so a surface nobody thought of shows none either.

Imports nothing of the sidecar: every part may use it.

What an operator needs stays: a password-less URL whole, the host, the port, a database user's name, the program
and every argument that is not a credential.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Sequence
from urllib.parse import unquote

__all__ = [
    "MASK",
    "masked_command",
    "masked_url",
    "remember_secrets",
    "scrub",
    "secret_values",
    "shown_upstream",
]

MASK = "***"
MIN_SCRUBBED_CHARS = 8
"""A remembered value shorter than this is masked by shape only: scrubbing an `env` value such as `true` or `info`
from every line would mangle them. Tokens and generated passwords are longer."""

_NETLOC_END = re.compile(r"[/?#]")
_SECRET_PARAMETER = re.compile(r"pass|pwd|token|secret|key|auth|sig|cred|jwt", re.IGNORECASE)
"""Query parameters whose value is a credential (`?password=`, `?api_key=`, `?token=`, `?sig=`)."""
_SECRET_ARGUMENT = re.compile(
    r"(^|[-_.])(pass|password|passwd|pwd|token|secret|api[-_]?key|apikey|credentials?|auth[-_]?token)$", re.IGNORECASE
)
"""A command argument named like a credential (`--password`, `--api-key`, `--github-token`, `DB_PASSWORD=`): its
value is masked, as `--name VALUE` or `--name=VALUE`. Narrower than the query rule: `--key server.key` and
`--auth none` name files and modes, which an operator needs to see."""
_TOKEN_AS_USER_SCHEMES = ("http", "https", "ws", "wss")
"""Where the whole userinfo is a credential (`https://TOKEN@`, `https://TOKEN:x-oauth-basic@`). Elsewhere (Redis,
PostgreSQL) the user is an account's name, shown; only its password is masked."""
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def masked_url(url: str) -> str:
    """`url` with its credentials masked: the password of its `user:password@` (an HTTP URL's whole userinfo) and
    the values of credential query parameters.

    Written for every URL the configuration holds, a Redis Cluster's `host:port,host:port` seed list included
    (which the standard library's URL parser refuses), so it splits the text itself."""
    return _masked_url(url, [])


def masked_command(command: Sequence[str]) -> list[str]:
    """A stdio command's words with the credentials among its arguments masked: URLs as `masked_url` does, and the
    value of an argument named like a credential. The program and every other argument are kept."""
    return _masked_command(command, [])


def shown_upstream(url: str, command: Sequence[str] | None) -> str:
    """The upstream as every surface names it: its masked URL, or `stdio: <masked command>`."""
    if command is not None and not url:
        return "stdio: " + " ".join(_quoted(word) for word in masked_command(command))
    return masked_url(url)


def secret_values(
    *, urls: Iterable[str] = (), commands: Iterable[Sequence[str]] = (), values: Iterable[str] = ()
) -> set[str]:
    """The credentials inside `urls` and `commands` (what `masked_url` and `masked_command` mask) and the plain
    secret `values` (header and `env` values, and the token of an `Authorization`-style `scheme TOKEN`), in every
    form they may be written in (percent-decoded, escaped in a JSON string), for `remember_secrets`."""
    found: list[str] = []
    for url in urls:
        _masked_url(url, found)
    for command in commands:
        _masked_command(command, found)
    for text in values:
        found.append(text)
        scheme, space, credential = text.strip().partition(" ")
        if space and scheme.isalpha():
            found.append(credential.strip())  # `Bearer TOKEN`: the token alone may appear where the header does not
    return {variant for value in found for variant in _variants(value) if len(variant) >= MIN_SCRUBBED_CHARS}


# -- by value ---------------------------------------------------------------------------------------------------------

_remembered: set[str] = set()
_pattern: re.Pattern[str] | None = None


def remember_secrets(values: Iterable[str]) -> None:
    """Add credential values for `scrub` to mask (process-wide: the log handler is too). Values only accumulate:
    masking one that no longer serves costs nothing."""
    global _pattern
    new = {value for value in values if len(value) >= MIN_SCRUBBED_CHARS} - _remembered
    if not new:
        return
    _remembered.update(new)
    longest_first = sorted(_remembered, key=len, reverse=True)  # a secret that holds another is masked whole
    _pattern = re.compile("|".join(re.escape(value) for value in longest_first))


def scrub(text: str) -> str:
    """`text` with the credentials of every URL in it masked (by shape, as `masked_url` does) and every remembered
    credential value masked wherever it appears."""
    if "://" in text:
        text = _URL_IN_TEXT.sub(lambda match: masked_url(match.group()), text)
    if _pattern is not None:
        text = _pattern.sub(MASK, text)
    return text


# -- by shape ---------------------------------------------------------------------------------------------------------


def _masked_url(url: str, found: list[str]) -> str:
    scheme, separator, rest = url.partition("://")
    if not separator:
        return url
    end = _NETLOC_END.search(rest)
    netloc, tail = (rest[: end.start()], rest[end.start() :]) if end else (rest, "")
    userinfo, at, hosts = netloc.rpartition("@")
    if at:
        user, colon, password = userinfo.partition(":")
        if scheme.lower() in _TOKEN_AS_USER_SCHEMES:
            netloc = f"{MASK}@{hosts}"  # `https://TOKEN@host`, `https://TOKEN:x-oauth-basic@host`
            found.extend(part for part in (user, password) if part)
        elif colon:
            netloc = f"{user}:{MASK}@{hosts}"
            found.append(password)
    path, question, query = tail.partition("?")
    if question:
        query, hash_mark, fragment = query.partition("#")
        query = "&".join(_masked_parameter(pair, found) for pair in query.split("&")) + hash_mark + fragment
    return f"{scheme}://{netloc}{path}{question}{query}"


def _masked_parameter(pair: str, found: list[str]) -> str:
    name, equals, value = pair.partition("=")
    if equals and value and _SECRET_PARAMETER.search(name):
        found.append(value)
        return f"{name}={MASK}"
    return pair


def _masked_command(command: Sequence[str], found: list[str]) -> list[str]:
    shown: list[str] = []
    secret_next = False
    for word in command:
        if secret_next and not word.startswith("-"):
            found.append(word)
            shown.append(MASK)
            secret_next = False
            continue
        secret_next = False
        name, equals, value = word.partition("=")
        if equals and value and "://" not in name and _SECRET_ARGUMENT.search(name.lstrip("-")):
            found.append(value)
            shown.append(f"{name}={MASK}")
        elif word.startswith("-") and not equals and _SECRET_ARGUMENT.search(word.lstrip("-")):
            shown.append(word)
            secret_next = True
        else:
            shown.append(_URL_IN_TEXT.sub(lambda match: _masked_url(match.group(), found), word))
    return shown


def _quoted(word: str) -> str:
    """`word` as a shell would need it written, a mask left bare (`--password=***`, not `'--password=***'`)."""
    plain = word.replace(MASK, "x")
    return word if shlex.quote(plain) == plain else shlex.quote(word)


def _variants(value: str) -> set[str]:
    """The forms a value may be written in: as given, percent-decoded, and escaped inside a JSON string."""
    forms = {value, unquote(value)}
    return forms | {json.dumps(form)[1:-1] for form in forms}
