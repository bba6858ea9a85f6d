"""`polling.rules`: per-URI polling intervals and what does not count as a change, checked when the file loads.

A rule's `match` is a glob over the URI (`*` matches any run of characters, nothing else is special); its
`ignore.json_pointers` are RFC 6901 pointers; its `ignore.patterns` are Python regular expressions. A bad one
fails at start naming `polling.rules[i]...`.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from sidecar.config.base import Section

__all__ = ["IgnoreRule", "PollingRule", "check_glob", "check_json_pointer", "check_pattern"]

_POINTER_ESCAPE = re.compile(r"~(?![01])")


def check_glob(value: str) -> str:
    if not value:
        raise ValueError("an empty glob matches no URI")
    if any(char.isspace() or not char.isprintable() for char in value):
        raise ValueError(f"{value!r}: a URI glob holds no whitespace or control characters")
    return value


def check_json_pointer(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"{value!r}: a JSON pointer starts with '/' (RFC 6901; the whole document is not ignorable)")
    if _POINTER_ESCAPE.search(value):
        raise ValueError(f"{value!r}: '~' must be written '~0', and '/' inside a name '~1' (RFC 6901)")
    return value


def check_pattern(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"{value!r} is not a regular expression: {exc}") from None
    return value


class IgnoreRule(Section):
    json_pointers: list[Annotated[str, AfterValidator(check_json_pointer)]] = Field(
        default_factory=list,
        description="Members removed (RFC 6901) from a text content that parses as JSON, and from structured "
        "content, before the fingerprint.",
    )
    patterns: list[Annotated[str, AfterValidator(check_pattern)]] = Field(
        default_factory=list, description="Regular expressions whose matches are removed from text contents first."
    )


class PollingRule(Section):
    match: Annotated[str, AfterValidator(check_glob)] = Field(
        description="The URIs it applies to: a glob in which * matches any run of characters."
    )
    interval_ms: int | None = Field(
        None,
        ge=1,
        description="Replaces the interval the upstream's ttlMs would give (still within min/max_interval_ms).",
    )
    ignore: IgnoreRule = Field(default_factory=IgnoreRule, description="What does not count as a change.")
