"""Content fingerprints: a hash of the canonical JSON of what matters, never of cache hints or cursors."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import orjson

__all__ = ["ABSENT", "fingerprint_contents", "fingerprint_error", "fingerprint_items", "is_error_state"]

ABSENT = "absent"
"""The fingerprint of a resource that answers not-found: disappearing and reappearing are changes."""

_ERROR_PREFIX = "error:"
"""Begins the fingerprint of an error state (a hex digest never holds a colon): recognisable wherever it travels."""

_IGNORED_KEYS = frozenset({"_meta", "ttlMs", "cacheScope", "resultType", "nextCursor"})


def _canonical(value: Any) -> bytes:
    try:
        return orjson.dumps(_strip(value), option=orjson.OPT_SORT_KEYS)
    except (TypeError, RecursionError) as exc:
        # orjson reads 1024 levels of nesting but writes only 254: such content cannot be fingerprinted.
        raise ValueError("content nested too deeply to fingerprint") from exc


def _strip(value: Any) -> Any:
    # `_meta` may carry per-request noise (timestamps, trace ids) at any depth; it is never content.
    if isinstance(value, dict):
        return {key: _strip(item) for key, item in value.items() if key not in _IGNORED_KEYS}
    if isinstance(value, list):
        return [_strip(item) for item in value]
    return value


def fingerprint_contents(contents: Any) -> str:
    """The fingerprint of a `resources/read` result's `contents`; ValueError if it cannot be taken."""
    return hashlib.blake2b(_canonical(contents), digest_size=16).hexdigest()


def fingerprint_items(items: Iterable[Any]) -> str:
    """The fingerprint of a list's items, in an order independent of how the upstream paged or sorted them."""
    digest = hashlib.blake2b(digest_size=16)
    for encoded in sorted(_canonical(item) for item in items):
        digest.update(len(encoded).to_bytes(8, "big"))
        digest.update(encoded)
    return digest.hexdigest()


def fingerprint_error(code: object, message: object) -> str:
    """The fingerprint of a read the upstream answered with a JSON-RPC error: the resource's state is that error,
    told apart from content and from every other error by its code and message (invariant 24)."""
    digest = hashlib.blake2b(_canonical({"code": code, "message": message}), digest_size=16).hexdigest()
    return _ERROR_PREFIX + digest


def is_error_state(fingerprint: str) -> bool:
    """Whether `fingerprint` is an error state's (`fingerprint_error`)."""
    return fingerprint.startswith(_ERROR_PREFIX)
