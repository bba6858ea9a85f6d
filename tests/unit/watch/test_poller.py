"""Schedule arithmetic, the ticket rule and the generation rule, without a server or a clock (one poll as its driver
runs it: `test_poll_once`)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time

import pytest

from sidecar.changes import ChangeEvent, WatchKey
from sidecar.config import PollingConfig
from sidecar.watch.engine.polls import LogLimiter
from sidecar.watch.observation import Observation
from sidecar.watch.poller import Watch
from sidecar.watch.schedule import Schedule
from sidecar.watch.tickets import Tickets
from tests.unit.watch.watches import make_watch

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


def test_an_interval_under_the_read_budget_is_jittered_but_never_past_max_interval() -> None:
    low = Schedule(CONFIG, rand=lambda: 0.0)
    high = Schedule(CONFIG, rand=lambda: 0.999999)
    assert low.budgeted_s(10_000) == pytest.approx(9.0) and high.budgeted_s(10_000) == pytest.approx(11.0, rel=1e-4)
    # The budget covering every key gives each its wanted interval: jittered up, it would pass max_interval_ms.
    assert high.budgeted_s(60_000) == 60.0 and low.budgeted_s(60_000) == pytest.approx(54.0)


def test_backoff_is_jittered_even_when_interval_jitter_is_off() -> None:
    schedule = Schedule(CONFIG.model_copy(update={"jitter": 0.0}), rand=lambda: 0.0)
    assert schedule.backoff_s(1) < 1.0


_watch = functools.partial(make_watch, config=CONFIG)


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
    assert usual.backstop_s(2000, 10_000) == usual.interval_s(2000, 10_000) == 10.0  # the key's rule, as uncovered
    stretched = Schedule(CONFIG.model_copy(update={"native_backstop_ms": 60_000}), rand=lambda: 0.5)
    assert stretched.backstop_s(2000) == 60.0


def test_an_observation_with_the_ticket_already_applied_is_ignored() -> None:
    watch = _watch()
    assert watch.offer(Observation("fp-1", None, True), ticket=1) is None  # the baseline's own ticket
    assert watch.fingerprint == "fp-0"


def test_a_new_watch_has_neither_polled_nor_changed_and_is_held_by_no_stream() -> None:
    watch = _watch()
    assert (watch.refs, watch.generation, watch.consecutive_errors) == (0, 0, 0)
    assert watch.last_poll_at is None and watch.last_change_at is None
    assert watch.native is False


def test_every_applied_look_is_told_to_the_cache_and_each_change_bumps_the_generation() -> None:
    told: list[tuple[WatchKey, str, int]] = []
    watch = _watch(observed=lambda key, fingerprint, ticket: told.append((key, fingerprint, ticket)))
    before = time.time()
    first = watch.offer(Observation("fp-1", None, True), ticket=11)
    same = watch.offer(Observation("fp-1", None, True), ticket=12)
    second = watch.offer(Observation("fp-2", None, True), ticket=13)
    watch.offer(Observation("fp-3", None, True), ticket=12)  # stale: not applied, not told
    assert told == [(watch.key, "fp-1", 11), (watch.key, "fp-1", 12), (watch.key, "fp-2", 13)]
    assert same is None
    assert first is not None and second is not None
    assert (first.key, first.fingerprint, first.generation) == (watch.key, "fp-1", 1)
    assert (second.key, second.fingerprint, second.generation) == (watch.key, "fp-2", 2)
    assert before <= first.detected_at <= second.detected_at <= time.time()
    assert watch.last_change_at == second.detected_at


def test_a_change_is_logged_with_the_watch_its_generation_and_both_fingerprints_short(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watch = _watch()
    watch.offer(Observation("fedcba9876543210", None, True), ticket=11)
    with caplog.at_level(logging.INFO, logger="sidecar.watch.poller"):
        watch.offer(Observation("0123456789abcdef", None, True), ticket=12)
    [record] = [r for r in caplog.records if r.getMessage() == "change detected"]
    fields = {name: getattr(record, name, None) for name in ("watch", "kind", "generation", "old", "new")}
    assert fields == {
        "watch": watch.key.short_hash,
        "kind": "resource",
        "generation": 2,
        "old": "fedcba98",
        "new": "01234567",
    }


def test_a_change_another_replica_told_is_taken_as_ours_and_not_told_again() -> None:
    watch = _watch()
    watch.adopt("fp-1")
    watch.adopt("fp-1")
    assert (watch.fingerprint, watch.generation) == ("fp-1", 1)
    assert watch.offer(Observation("fp-1", None, True), ticket=11) is None, "our next poll sees no change"
    watch.adopt("fp-2")
    assert (watch.fingerprint, watch.generation) == ("fp-2", 2)


def test_failure_lines_are_allowed_one_per_interval_from_the_first_one_on_even_right_after_boot() -> None:
    limiter = LogLimiter(10.0)  # the monotonic clock starts near 0 at boot
    allowed = [limiter.allow(now) for now in (0.0, 9.999, 10.0, 15.0, 19.999, 20.0)]
    assert allowed == [True, False, True, False, False, True]
