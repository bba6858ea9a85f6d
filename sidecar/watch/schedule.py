"""When a watch polls: its interval, jitter and backoff, and the budget hinted polls share.

Target load: one read per key per interval (ttlMs clamped to [min, max], +/- jitter); while the upstream
fails, exponential backoff from `backoff_initial_ms` to `backoff_max_ms`, so a dead upstream sees about
one request per key per minute.
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar.backoff import JITTER, Backoff, jittered
from sidecar.config import PollingConfig

__all__ = ["HintBudget", "Schedule"]

_MIN_BACKOFF_JITTER = 0.1


class Schedule:
    """Interval, jitter and backoff (spec MUST: jitter on every interval, exponential backoff on errors)."""

    def __init__(self, config: PollingConfig, rand: Callable[[], float] = JITTER.random) -> None:
        self._config = config
        self._rand = rand
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
