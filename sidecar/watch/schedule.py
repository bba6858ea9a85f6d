"""When a watch polls: its interval, jitter and backoff, and the budget hinted polls share.

Target load: one read per key per interval (ttlMs clamped to [min, max], +/- jitter); while the upstream
fails, exponential backoff from `backoff_initial_ms` to `backoff_max_ms`, so a dead upstream sees about
one request per key per minute. After a hint whose look saw no change, a few more looks while the watch is
warm (`warm_look`): a source whose reads lag its writes shows the change to one of them.
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar.backoff import JITTER, Backoff, jittered
from sidecar.config import PollingConfig

__all__ = ["HintBudget", "Schedule"]

_MIN_BACKOFF_JITTER = 0.1
_WARM_FIRST_S = 0.25
"""The first look after a hint's own comes this long after the hint; each next one twice as long after it."""


class Schedule:
    """Interval, jitter and backoff (spec MUST: jitter on every interval, exponential backoff on errors)."""

    def __init__(self, config: PollingConfig, rand: Callable[[], float] = JITTER.random, *, settle_ms: int = 0) -> None:
        self._config = config
        self._rand = rand
        self.settle_s = settle_ms / 1000
        """How long after a hint a watch stays warm (`hints.settle_ms`); 0: a hint asks for one look."""
        self._warm_offsets = _warm_offsets(self.settle_s)
        self._backoff = Backoff(
            config.backoff_initial_ms, config.backoff_max_ms, jitter=max(config.jitter, _MIN_BACKOFF_JITTER), rand=rand
        )
        self._spread_until = float("-inf")
        """Until when hinted polls are spread: a window opened by the last hint that polled at once."""

    @property
    def min_interval_s(self) -> float:
        return self._config.min_interval_ms / 1000

    def _jittered(self, base_ms: float, jitter: float) -> float:
        return jittered(base_ms, jitter, self._rand) / 1000

    def wanted_ms(self, ttl_ms: int | None, rule_ms: int | None = None, *, native: bool = False) -> int:
        """The interval before jitter: the key's rule, else ttlMs (absent or 0: the default), within [min, max];
        `native_backstop_ms` for a key the upstream's own notifications cover, when set."""
        config = self._config
        if native and config.native_backstop_ms:
            return config.native_backstop_ms
        base = rule_ms or (config.default_interval_ms if not ttl_ms else ttl_ms)
        return min(max(base, config.min_interval_ms), config.max_interval_ms)

    def interval_s(self, ttl_ms: int | None, rule_ms: int | None = None) -> float:
        """ttlMs (or the key's rule) clamped to [min, max]; absent or 0 means the default interval."""
        return self._jittered(self.wanted_ms(ttl_ms, rule_ms), self._config.jitter)

    def backstop_s(self, ttl_ms: int | None, rule_ms: int | None = None) -> float:
        """The interval of a key the upstream's own notifications cover: `native_backstop_ms`, or (0) the usual."""
        if not self._config.native_backstop_ms:
            return self.interval_s(ttl_ms, rule_ms)
        return self._jittered(self._config.native_backstop_ms, self._config.jitter)

    def budgeted_s(self, allocated_ms: float) -> float:
        """An interval a read budget allocated, jittered, never past max_interval_ms (no key starves)."""
        return min(self._jittered(allocated_ms, self._config.jitter), self._config.max_interval_ms / 1000)

    def hint_jitter_s(self, now: float, *, waits: bool) -> float:
        """Spread for hinted polls: up to `jitter` of min_interval_ms. A hint that `waits` out min_interval_ms is
        an interval, always jittered; one that may poll at once does so when it is the first for that spread (a
        lone write's key is polled without a pause), and every hint after it within the spread is spread over
        it, so a burst across many keys still never fires in one instant."""
        spread = self._config.jitter * self._config.min_interval_ms / 1000
        if not waits and now >= self._spread_until:
            self._spread_until = now + spread
            return 0.0
        return self._rand() * spread

    def backoff_s(self, consecutive_errors: int) -> float:
        return self._backoff.delay(consecutive_errors) / 1000

    def warm_look(self, hinted_at: float, after: float) -> float | None:
        """When a watch hinted at `hinted_at`, whose last look started at `after` and saw no change, wants its next
        look: the first of 0.25, 0.5, 1, 2 s... and settle_ms after the hint that is later than that look; None once
        none is (the watch has settled)."""
        for offset in self._warm_offsets:
            if hinted_at + offset > after:
                return hinted_at + offset
        return None


def _warm_offsets(settle_s: float) -> tuple[float, ...]:
    """0.25, 0.5, 1, 2 s... short of `settle_s`, then `settle_s` itself (a change up to the end is seen then)."""
    offsets: list[float] = []
    offset = _WARM_FIRST_S
    while offset < settle_s:
        offsets.append(offset)
        offset *= 2
    if settle_s > 0:
        offsets.append(settle_s)
    return tuple(offsets)


class HintBudget:
    """Polls that hints may add, across every watch of one upstream: `per_s` a second, in bursts of as many
    (at least one), by the generic cell rate algorithm. A hinted poll past the budget is deferred to its slot,
    never dropped."""

    def __init__(self, per_s: float) -> None:
        self._interval = 1 / per_s
        # The tolerance: a burst of n runs at once when the last of them is at most (n - 1) intervals early.
        self._window = max(per_s - 1, 0) * self._interval
        self._tat = 0.0

    def slot(self, earliest: float) -> float:
        """When a hinted poll wanted at `earliest` may run (`earliest` itself while the budget lasts)."""
        allowed = max(earliest, self._tat - self._window)
        self._tat = max(self._tat, allowed) + self._interval
        return allowed
