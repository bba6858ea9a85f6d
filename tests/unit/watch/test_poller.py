"""Schedule arithmetic and the generation rule, without a server or a clock."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.changes import ChangeEvent, WatchKey
from sidecar.config import PollingConfig
from sidecar.observability.metrics import Metrics
from sidecar.watch.generations import Tickets
from sidecar.watch.observe import Observation
from sidecar.watch.poller import Reader, Schedule, Sink, Watch

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


async def _never(_: Watch) -> Observation | None:
    raise AssertionError("not polled in this test")


async def _drop(_: ChangeEvent) -> None:
    return None


def _watch(reader: Reader = _never, sink: Sink = _drop, tickets: Tickets | None = None) -> Watch:
    tickets = tickets or Tickets()
    return Watch(
        WatchKey("resource", "x://1", "public"),
        Observation("fp-0", None, True),
        ticket=tickets.take(),
        schedule=Schedule(CONFIG),
        reader=reader,
        sink=sink,
        gate=asyncio.Semaphore(1),
        tickets=tickets,
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


@pytest.mark.invariant(7)
async def test_a_poll_that_started_before_a_fresher_look_does_not_overwrite_it() -> None:
    # The poll's ticket is taken when it starts: a look that starts after it and is applied first wins, even
    # though the poll's answer arrives last.
    tickets = Tickets()
    reading, answer = asyncio.Event(), asyncio.Event()
    published: list[str] = []

    async def slow_read(_: Watch) -> Observation | None:
        reading.set()
        await answer.wait()
        return Observation("fp-stale", None, True)

    async def sink(event: ChangeEvent) -> None:
        published.append(event.fingerprint)

    watch = _watch(reader=slow_read, sink=sink, tickets=tickets)
    poll = asyncio.create_task(watch.poll_once(due=0.0))
    await reading.wait()
    fresh = watch.offer(Observation("fp-fresh", None, True), ticket=tickets.take())
    answer.set()
    await poll
    assert fresh is not None
    assert watch.fingerprint == "fp-fresh"
    assert published == []  # the stale answer is no change either


@pytest.mark.invariant(6)
def test_the_baseline_itself_is_not_a_change() -> None:
    watch = _watch()
    assert watch.offer(Observation("fp-0", None, True), ticket=11) is None
    assert watch.generation == 0


def test_an_observation_older_than_the_baseline_is_ignored() -> None:
    watch = _watch()
    assert watch.offer(Observation("fp-old", None, True), ticket=0) is None
    assert watch.fingerprint == "fp-0"


def test_a_covered_key_polls_at_its_usual_interval_unless_a_backstop_is_set() -> None:
    usual = Schedule(CONFIG, rand=lambda: 0.5)
    assert usual.backstop_s(2000) == usual.interval_s(2000)
    stretched = Schedule(CONFIG.model_copy(update={"native_backstop_ms": 60_000}), rand=lambda: 0.5)
    assert stretched.backstop_s(2000) == 60.0
