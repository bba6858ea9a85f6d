"""What one look at the upstream saw, as a value: its fingerprint, the upstream's freshness hint, whether it is public.

No I/O here (the look itself is `sidecar.watch.observe`'s): the engine, the evidence of forwarded reads and the
tests build and compare observations without an upstream. Which errors are the resource's state and which are
faults of the upstream is decided here too (invariant 24).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sidecar.protocol.errors import UpstreamRpcError
from sidecar.watch.fingerprint import ABSENT, fingerprint_contents, fingerprint_error, is_error_state
from sidecar.watch.rules import Rule

__all__ = ["Observation", "error_state", "is_not_found", "observation_from_read", "read_failed", "ttl_hint"]

_NOT_FOUND_CODES = (-32602, -32002)
_FAULT_STATUSES = (408, 429)
"""Statuses below 500 whose JSON-RPC error still speaks of the upstream (too slow, too busy), not the resource."""


@dataclass(frozen=True, slots=True)
class Observation:
    """What one look saw: the fingerprint, the upstream's freshness hint, and whether the result is public."""

    fingerprint: str
    ttl_ms: int | None
    public: bool

    @property
    def found(self) -> bool:
        return self.fingerprint != ABSENT

    @property
    def error(self) -> bool:
        """The upstream answered the read with a JSON-RPC error: that error is the resource's state."""
        return is_error_state(self.fingerprint)


def is_not_found(error: UpstreamRpcError) -> bool:
    return error.code in _NOT_FOUND_CODES


def error_state(error: UpstreamRpcError) -> Observation | None:
    """The resource's state when a reachable upstream answered its read with `error` (not a not-found); None when
    the error came with an HTTP 5xx, 408 or 429, which stays a fault of the upstream."""
    if error.upstream_status >= 500 or error.upstream_status in _FAULT_STATUSES:
        return None
    return Observation(fingerprint_error(error.code, error.error.get("message")), None, False)


def read_failed(error: UpstreamRpcError, *, errors_are_states: bool) -> Observation | None:
    """What a `resources/read` answered with `error` saw: absent when the upstream does not find the resource; with
    `errors_are_states` (a watch's poll), the error as the resource's state; None when the error is the look's to
    raise (any other error of a first read, which has nothing to subscribe to yet, or a fault of the upstream)."""
    if is_not_found(error):
        return Observation(ABSENT, None, False)
    return error_state(error) if errors_are_states else None


def ttl_hint(result: dict[str, Any]) -> int | None:
    """A result's `ttlMs`, when it is a positive integer."""
    ttl = result.get("ttlMs")
    return ttl if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl > 0 else None


def observation_from_read(result: dict[str, Any], rule: Rule | None = None) -> Observation:
    """The observation a `resources/read` result gives (a forwarded read is evidence too); `rule`: the URI's
    `polling.rules` entry, whose ignored parts do not count."""
    contents = result.get("contents")
    if rule is not None:
        contents = rule.significant(contents)
    return Observation(fingerprint_contents(contents), ttl_hint(result), result.get("cacheScope") == "public")
