"""`polling.max_reads_per_s` and `polling.rules` in the engine: a real `WatchRegistry` on the hand-moved clock,
reading a scripted upstream that counts its reads. Figures here are engine time, not machine speed."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import AsyncIterator
from typing import cast

import pytest

from sidecar.bus.memory import MemoryBus
from sidecar.changes import ChangeEvent
from sidecar.config import PollingConfig
from sidecar.config.polling_rules import PollingRule
from sidecar.fair_share import FairShare
from sidecar.identity import ANONYMOUS_IDENTITY, Identity
from sidecar.observability.metrics import Metrics
from sidecar.upstream.base import Upstream
from sidecar.watch.registry import WatchRegistry
from tests.unit.watch.manual_clock import ManualClock, run_polls
from tests.unit.watch.scripted_upstream import ScriptedUpstream, contents

BUDGET = PollingConfig(
    default_interval_ms=200,
    min_interval_ms=200,
    max_interval_ms=10_000,
    max_reads_per_s=60,
    max_baselines_per_s=10_000,
    max_hinted_polls_per_s=10_000,
    revalidate_debounce_ms=0,
)
"""300 keys wanting a read every 200 ms (1,500 a second) against 60 a second; every key read every 10 s at least."""
HOT, KEYS = 30, 300


class CountingUpstream(ScriptedUpstream):
    """The scripted upstream, noting when (on the engine's clock) each URI was read."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock
        self.read_at: dict[str, list[float]] = {}

    async def call(self, method: str, params: dict[str, object], identity: Identity) -> dict[str, object]:
        if method == "resources/read":
            self.read_at.setdefault(str(params["uri"]), []).append(self.clock.now())
        return await super().call(method, params, identity)

    def longest_unread(self, since: float, until: float) -> float:
        """The longest any URI went without a read between `since` and `until`."""
        gaps = []
        for times in self.read_at.values():
            edges = [since, *(t for t in times if since < t < until), until]
            gaps.append(max(b - a for a, b in itertools.pairwise(edges)))
        return max(gaps)


class Engine:
    def __init__(self, config: PollingConfig) -> None:
        self.clock = ManualClock()
        self.upstream = CountingUpstream(self.clock)
        self.bus = MemoryBus()
        self.metrics = Metrics()
        fair = FairShare(capacity=64, per_client=64, max_queued_per_client=10_000, metrics=self.metrics)
        self.registry = WatchRegistry(
            cast(Upstream, self.upstream), config, self.bus, self.metrics, fair, clock=self.clock
        )
        self.told: list[tuple[float, ChangeEvent]] = []
        self.bus.subscribe(lambda event: self.told.append((self.clock.now(), event)))

    def reads(self) -> list[str]:
        return [uri for method, uri, _ in self.upstream.calls if method == "resources/read"]

    async def watch(self, uris: list[str]) -> None:
        for uri in uris:
            self.upstream.resources[uri] = contents(uri, "0")
            assert await self.registry.acquire("resource", uri, ANONYMOUS_IDENTITY) is not None


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    engine = Engine(BUDGET)
    yield engine
    await engine.registry.aclose()


def _uris() -> list[str]:
    return [f"bench://hot/{n}" for n in range(HOT)] + [f"bench://cold/{n}" for n in range(KEYS - HOT)]


@pytest.mark.invariant(21)
async def test_polls_never_exceed_the_budget_and_every_key_is_read_within_its_maximum_interval(engine: Engine) -> None:
    uris = _uris()
    await engine.watch(uris)
    start, first = engine.clock.now(), len(engine.reads())
    seconds = 30.0
    for _ in range(int(seconds * 10)):
        await run_polls(engine.clock, 0.1)
    polls = engine.reads()[first:]
    assert len(polls) <= BUDGET.max_reads_per_s * seconds + 1
    assert len(polls) >= 0.8 * BUDGET.max_reads_per_s * seconds, "the budget is spent, not left idle"
    assert set(polls) == set(uris), "no key went unread for its maximum interval"
    assert engine.clock.now() - start == pytest.approx(seconds)


@pytest.mark.invariant(21)
async def test_hinted_polls_count_against_the_budget(engine: Engine) -> None:
    await engine.watch(_uris()[:40])
    first = len(engine.reads())
    seconds = 10.0
    for _ in range(int(seconds * 20)):
        engine.registry.revalidate(ANONYMOUS_IDENTITY)  # a write every 50 ms hints every public watch
        await run_polls(engine.clock, 0.05)
    assert len(engine.reads()) - first <= BUDGET.max_reads_per_s * seconds + 1


async def _staleness(policy: str) -> tuple[list[float], float]:
    """Every hot key changes each second for a minute: each change's wait until it is told, and the longest any
    key went unread."""
    config = BUDGET.model_copy(update={"allocation": policy})
    engine = Engine(config)
    try:
        uris = _uris()
        await engine.watch(uris)
        changed: dict[str, list[float]] = {uri: [] for uri in uris[:HOT]}
        for second in range(60):
            for uri in uris[:HOT]:
                engine.upstream.resources[uri] = contents(uri, str(second + 1))
                changed[uri].append(engine.clock.now())
            for _ in range(10):
                await run_polls(engine.clock, 0.1)
        waits = []
        for uri, times in changed.items():
            told = sorted(at for at, event in engine.told if event.key.uri == uri and not event.baseline)
            for at in times[10:]:  # after the first ten seconds, once rates are known
                later = [t for t in told if t >= at]
                if later:
                    waits.append(later[0] - at)
        return waits, engine.upstream.longest_unread(10.0, engine.clock.now())
    finally:
        await engine.registry.aclose()


@pytest.mark.invariant(21)
async def test_adaptive_spends_the_budget_where_changes_are() -> None:
    adaptive, adaptive_unread = await _staleness("adaptive")
    uniform, uniform_unread = await _staleness("uniform")
    assert statistics.mean(adaptive) <= 0.6 * statistics.mean(uniform), (
        statistics.mean(adaptive),
        statistics.mean(uniform),
    )
    # No cold key waits longer than its maximum interval (a slot of the budget late at most).
    assert max(adaptive_unread, uniform_unread) <= BUDGET.max_interval_ms / 1000 + 0.2


async def test_a_rule_sets_a_keys_interval_and_ignores_its_noise() -> None:
    rule = PollingRule.model_validate(
        {"match": "report://*", "interval_ms": 1000, "ignore": {"json_pointers": ["/generatedAt"]}}
    )
    engine = Engine(PollingConfig(default_interval_ms=5000, jitter=0.0, rules=[rule]))
    try:
        uri = "report://daily"
        engine.upstream.resources[uri] = contents(uri, '{"total": 1, "generatedAt": 0}')
        await engine.watch([])
        assert await engine.registry.acquire("resource", uri, ANONYMOUS_IDENTITY) is not None
        for stamp in range(1, 6):
            engine.upstream.resources[uri] = contents(uri, f'{{"total": 1, "generatedAt": {stamp}}}')
            await run_polls(engine.clock, 1.0)
        assert len(engine.reads()) == 6, "read every second (its rule), not every 5 s (the default)"
        assert [event for _, event in engine.told if not event.baseline] == [], "a new stamp is no change"
        engine.upstream.resources[uri] = contents(uri, '{"total": 2, "generatedAt": 9}')
        await run_polls(engine.clock, 1.0)
        assert len([event for _, event in engine.told if not event.baseline]) == 1
    finally:
        await engine.registry.aclose()
