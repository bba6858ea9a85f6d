"""Schedule arithmetic and the generation rule, without a server or a clock."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.changes import WatchKey
from sidecar.config import PollingConfig
from sidecar.observability.metrics import Metrics
from sidecar.watch.observe import Observation
from sidecar.watch.poller import Schedule, Watch

CONFIG = PollingConfig(
    default_interval_ms=5000,
    min_interval_ms=250,
    max_interval_ms=60000,
    jitter=0.1,
    backoff_initial_ms=1000,
    backoff_max_ms=8000,
)


@pytest.mark.invariant(9)
@pytest.mark.parametrize(
    ("ttl_ms", "base_s"),
    [(None, 5.0), (0, 5.0), (100, 0.25), (2000, 2.0), (10**9, 60.0)],
    ids=["absent", "zero", "below-min", "in-range", "above-max"],
)
def test_interval_is_ttl_clamped_with_jitter_on_both_sides(ttl_ms: int | None, base_s: float) -> None:
    low = Schedule(CONFIG, rand=lambda: 0.0).interval_s(ttl_ms)
    high = Schedule(CONFIG, rand=lambda: 0.999999).interval_s(ttl_ms)
    assert low == pytest.approx(base_s * 0.9)
    assert high == pytest.approx(base_s * 1.1, rel=1e-4)


@pytest.mark.invariant(9)
def test_backoff_doubles_up_to_its_cap() -> None:
    schedule = Schedule(CONFIG, rand=lambda: 0.5)  # no jitter at the midpoint
    assert [schedule.backoff_s(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 8.0, 8.0]


def test_backoff_is_jittered_even_when_interval_jitter_is_off() -> None:
    schedule = Schedule(CONFIG.model_copy(update={"jitter": 0.0}), rand=lambda: 0.0)
    assert schedule.backoff_s(1) < 1.0


def _watch() -> Watch:
    async def never(_: Watch) -> Observation | None:
        raise AssertionError("not polled in this test")

    async def sink(_: object) -> None:
        return None

    return Watch(
        WatchKey("resource", "x://1", "public"),
        Observation("fp-0", None, True),
        ticket=10,
        schedule=Schedule(CONFIG),
        reader=never,
        sink=sink,
        gate=asyncio.Semaphore(1),
        next_ticket=lambda: 0,
        metrics=Metrics(),
        on_auth_failure=lambda *_: None,
    )


@pytest.mark.invariant(7)
def test_a_stale_observation_never_overwrites_a_fresher_one() -> None:
    watch = _watch()
    fresh = watch.offer(Observation("fp-2", None, True), ticket=12)
    stale = watch.offer(Observation("fp-1", None, True), ticket=11)
    assert fresh is not None and fresh.generation == 1
    assert stale is None
    assert watch.fingerprint == "fp-2"


@pytest.mark.invariant(6)
def test_the_baseline_itself_is_not_a_change() -> None:
    watch = _watch()
    assert watch.offer(Observation("fp-0", None, True), ticket=11) is None
    assert watch.generation == 0


def test_an_observation_older_than_the_baseline_is_ignored() -> None:
    watch = _watch()
    assert watch.offer(Observation("fp-old", None, True), ticket=9) is None
    assert watch.fingerprint == "fp-0"


def test_a_covered_key_polls_at_its_usual_interval_unless_a_backstop_is_set() -> None:
    usual = Schedule(CONFIG, rand=lambda: 0.5)
    assert usual.backstop_s(2000) == usual.interval_s(2000)
    stretched = Schedule(CONFIG.model_copy(update={"native_backstop_ms": 60_000}), rand=lambda: 0.5)
    assert stretched.backstop_s(2000) == 60.0
