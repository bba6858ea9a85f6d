"""Which first reads (baselines) go upstream at once: a brief memory of missing resources, and a rate per client.

Without it a listen naming 1,000 resources that do not exist costs 1,000 upstream reads, every time it is
sent. A resource found missing is not read again for that context for `polling.default_interval_ms` (a
watch would not poll it sooner either); a client may start `polling.max_baselines_per_s` reads a second
(a bucket of as many tokens) beside the polls, and the rest wait their turn in its fair share (see
`WatchRegistry`), so they cost others no more than its forwarded requests do.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cachetools import LRUCache, TTLCache

from sidecar.changes import WatchKind

__all__ = ["Admission"]

_MAX_REMEMBERED = 10_000
"""Missing resources and per-client buckets remembered at most (least recently used go first)."""


class _Bucket:
    """Token bucket: `rate` tokens a second, holding at most `rate`."""

    __slots__ = ("tokens", "updated")

    def __init__(self, rate: float, now: float) -> None:
        self.tokens = rate
        self.updated = now


class Admission:
    """Answers "may this client read this URI for a baseline now, without waiting its turn?"."""

    def __init__(self, *, absent_ttl_s: float, rate_per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._rate = rate_per_s
        self._absent: TTLCache[tuple[WatchKind, str | None, str], bool] = TTLCache(
            maxsize=_MAX_REMEMBERED, ttl=absent_ttl_s, timer=clock
        )
        self._buckets: LRUCache[str, _Bucket] = LRUCache(maxsize=_MAX_REMEMBERED)

    def known_absent(self, kind: WatchKind, uri: str | None, context: str) -> bool:
        return (kind, uri, context) in self._absent

    def absent(self, kind: WatchKind, uri: str | None, context: str) -> None:
        """The upstream answered not-found to this context's read of it just now."""
        # Only membership is ever read, never the value: a mutant of it is equivalent.
        self._absent[(kind, uri, context)] = True  # pragma: no mutate

    def present(self, uri: str | None = None, context: str | None = None) -> None:
        """A read by `context` found `uri` after all; or (no arguments) the resource list changed: forget."""
        if uri is None or context is None:
            self._absent.clear()
        else:
            self._absent.pop(("resource", uri, context), None)

    def take(self, client: str) -> bool:
        """One baseline read for `client` now, if its rate allows."""
        now = self._clock()
        bucket = self._buckets.get(client)
        if bucket is None:
            bucket = self._buckets[client] = _Bucket(self._rate, now)
        bucket.tokens = min(self._rate, bucket.tokens + (now - bucket.updated) * self._rate)
        bucket.updated = now
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True
