"""The signals a client has not been written yet: a set keyed by (method, URI), never a queue (invariant 11).

One rule for listen streams and 2025-11-25 sessions alike: a change for a key already pending merges into it
(the first signal's detection time is kept, so delivery latency counts from the change the client has not yet
heard of) and the merge is counted (`mcp_sidecar_signals_coalesced_total`).
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["PendingSignals", "SignalKey"]

SignalKey = tuple[str, str | None]
"""(notification method, URI); a list's change has no URI."""


class _Counter(Protocol):
    def inc(self) -> None: ...  # one signal merged: prometheus_client's Counter.inc, whose amount defaults to 1


class PendingSignals(dict[SignalKey, float]):
    """Pending signals by key, with the time each was detected, in the order they came."""

    __slots__ = ("_coalesced",)

    def __init__(self, coalesced: _Counter) -> None:
        super().__init__()
        self._coalesced = coalesced

    def add(self, method: str, uri: str | None, detected_at: float) -> bool:
        """Synchronous, never raises; True when this signal made the set non-empty (whoever writes it is woken)."""
        key = (method, uri)
        if key in self:
            self._coalesced.inc()
            return False
        self[key] = detected_at
        return len(self) == 1
