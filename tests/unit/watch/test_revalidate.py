"""The write debounce, leading-edge: a lone write hints at once, a burst is at most two rounds of hints (the first
write's, and one for the writes within the window it opened), and through a watch at most two looks. On a clock
the test moves by hand; nothing sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator, Mapping
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanContext, Tracer

from sidecar.changes import ChangeEvent, LocalCoordinator, WatchKey
from sidecar.config import PollingConfig
from sidecar.observability.metrics import Metrics
from sidecar.observability.tracing import MAX_LINKS, Tracing, install
from sidecar.watch.observation import Observation
from sidecar.watch.poller import Watch
from sidecar.watch.revalidate import Revalidator
from sidecar.watch.schedule import Schedule
from sidecar.watch.tickets import Tickets
from tests.kit import WAIT_S, eventually
from tests.unit.watch.manual_clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


class _Rounds:
    """What a Revalidator does: the rounds of hints, and the announcements to other replicas it spawns."""

    def __init__(self) -> None:
        self.hinted: list[tuple[frozenset[str], Mapping[str, tuple[Any, ...]]]] = []
        self.announced: list[frozenset[str]] = []
        self.tasks: list[asyncio.Future[None]] = []
        rounds = self

        class Coordinator(LocalCoordinator):
            async def announce_revalidate(self, contexts: frozenset[str]) -> None:
                rounds.announced.append(contexts)

        self.coordinator = Coordinator()

    def hint(self, contexts: frozenset[str], links: Mapping[str, tuple[Any, ...]]) -> None:
        self.hinted.append((contexts, links))

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.ensure_future(coro))

    async def announcements(self) -> list[frozenset[str]]:
        """What the rounds so far told the other replicas, once each announcement spawned has run."""
        await asyncio.wait_for(asyncio.gather(*self.tasks), WAIT_S)
        return self.announced

    def contexts(self) -> list[frozenset[str]]:
        return [contexts for contexts, _ in self.hinted]

    def revalidator(self, clock: ManualClock, debounce_ms: int = 100) -> Revalidator:
        return Revalidator(debounce_ms, self.coordinator, self.hint, self.spawn, clock)


async def test_a_lone_write_hints_at_once_and_tells_the_other_replicas(clock: ManualClock) -> None:
    rounds = _Rounds()
    revalidator = rounds.revalidator(clock, debounce_ms=10_000)
    revalidator.wrote("alice")
    assert rounds.contexts() == [frozenset({"alice"})], "no wait for the debounce"
    assert await rounds.announcements() == [frozenset({"alice"})]


async def test_writes_within_the_window_are_one_trailing_round_at_its_end(clock: ManualClock) -> None:
    rounds = _Rounds()
    revalidator = rounds.revalidator(clock)
    revalidator.wrote("alice")
    clock.advance(0.05)
    revalidator.wrote("bob")
    revalidator.wrote("alice")
    clock.advance(0.04995)  # a twentieth of a millisecond before the window ends: still within it
    assert rounds.contexts() == [frozenset({"alice"})]
    clock.advance(0.00005)
    assert rounds.contexts() == [frozenset({"alice"}), frozenset({"alice", "bob"})]
    assert await rounds.announcements() == rounds.contexts()
    clock.advance(0.1)  # the window the trailing round opened ends with nothing written: no round
    assert len(rounds.hinted) == 2
    revalidator.wrote("carol")  # quiet again: at once
    assert rounds.contexts()[-1] == frozenset({"carol"}) and len(rounds.hinted) == 3


async def test_a_burst_within_the_window_is_at_most_two_rounds_however_many_writes(clock: ManualClock) -> None:
    rounds = _Rounds()
    revalidator = rounds.revalidator(clock, debounce_ms=1000)
    for n in range(1000):
        revalidator.wrote(f"ctx-{n % 7}")
        clock.advance(0.0009)
    clock.advance(5.0)
    assert len(rounds.hinted) == 2
    assert rounds.contexts()[1] == frozenset(f"ctx-{n}" for n in range(7))
    assert await rounds.announcements() == rounds.contexts()


async def test_a_write_after_the_window_closed_is_a_leading_edge_again(clock: ManualClock) -> None:
    rounds = _Rounds()
    revalidator = rounds.revalidator(clock)
    revalidator.wrote("alice")
    clock.advance(0.1)  # the window ends with nothing written within it
    clock.advance(0.001)
    revalidator.wrote("alice")
    assert len(rounds.hinted) == 2, "not made to wait for a window that ended"
    assert await rounds.announcements() == rounds.contexts()


async def test_a_write_just_before_shutdown_hints_nothing_afterwards(clock: ManualClock) -> None:
    rounds = _Rounds()
    revalidator = rounds.revalidator(clock)
    revalidator.wrote("alice")
    revalidator.wrote("bob")  # waits for the window's end
    revalidator.cancel()
    revalidator.cancel()  # twice is harmless
    clock.advance(1.0)
    assert rounds.contexts() == [frozenset({"alice"})] and len(rounds.tasks) == 1
    assert await rounds.announcements() == [frozenset({"alice"})]


# -- through a watch: the looks a burst of writes costs -------------------------------------------------------


class _HeldUpstream:
    """Reads that the test holds open, counted."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.polled_at: list[float] = []
        self.release = asyncio.Event()

    async def read(self, _: Watch) -> Observation:
        self.polled_at.append(self.clock.now())
        await self.release.wait()
        return Observation("fp-0", None, True)  # no ttlMs: the next regular poll is ten minutes away


def _watch(clock: ManualClock, upstream: _HeldUpstream) -> Watch:
    config = PollingConfig(default_interval_ms=600_000, min_interval_ms=10, max_interval_ms=600_000, jitter=0.1)
    tickets = Tickets()

    async def sink(event: ChangeEvent) -> None:
        raise AssertionError("nothing changed")

    watch = Watch(
        WatchKey("resource", "x://1", "public"),
        Observation("fp-0", None, True),
        tickets.take(),
        schedule=Schedule(config, rand=lambda: 0.5),
        reader=upstream.read,
        sink=sink,
        gate=asyncio.Semaphore(4),
        tickets=tickets,
        metrics=Metrics(),
        on_auth_failure=lambda *_: None,
        clock=clock,
    )
    watch.start()
    return watch


async def test_a_burst_of_writes_costs_a_watch_at_most_two_looks_and_the_first_is_at_once(
    clock: ManualClock,
) -> None:
    upstream = _HeldUpstream(clock)
    watch = _watch(clock, upstream)
    revalidator = Revalidator(
        100, LocalCoordinator(), lambda contexts, links: watch.hint(), lambda coro: coro.close(), clock
    )
    assert clock.advance(1.0) == 0  # well past min_interval_ms since the baseline
    revalidator.wrote("alice")
    clock.advance(0)
    await eventually(lambda: upstream.polled_at != [], what="the first write's look")
    assert upstream.polled_at == [1.0], "the first write of a quiet key looks at once"
    for _ in range(50):  # writes while that look is in flight, and within the window
        revalidator.wrote("alice")
        clock.advance(0.01)
    armed = clock.armed
    upstream.release.set()
    await eventually(lambda: clock.armed > armed, what="the look ends and the watch arms its next one")
    clock.advance(5.0)
    armed = clock.armed  # what the poll it fired arms from now on, once it has ended
    await eventually(
        lambda: len(upstream.polled_at) == 2 and clock.armed > armed,
        what="the trailing look the burst asked for, ended, and the watch's next look armed",
    )
    assert min(clock.due()) > 60.0, "the next look is the regular one, ten minutes on: no look left per write"
    assert len(upstream.polled_at) == 2, "one trailing look for the whole burst, never one per write"
    await watch.stop()


@pytest.fixture
def tracer() -> Iterator[Tracer]:
    provider = TracerProvider()
    previous = install(Tracing(provider.get_tracer("tests"), provider))
    try:
        yield provider.get_tracer("tests")
    finally:
        install(previous)
        provider.shutdown()


async def test_each_round_of_hints_links_each_contexts_traced_writes_up_to_max_links(
    clock: ManualClock, tracer: Tracer
) -> None:
    rounds = _Rounds()
    revalidator = rounds.revalidator(clock)
    with tracer.start_as_current_span("dave's write") as span:
        revalidator.wrote("dave")  # the leading edge: its round links its own write
        dave = span.get_span_context()
    assert [link.context for link in rounds.hinted[0][1]["dave"]] == [dave]
    alices: list[SpanContext] = []
    for n in range(MAX_LINKS + 2):
        with tracer.start_as_current_span(f"alice's write {n}") as span:
            revalidator.wrote("alice")
            alices.append(span.get_span_context())
    with tracer.start_as_current_span("bob's write") as span:
        revalidator.wrote("bob")
        bob = span.get_span_context()
    revalidator.wrote("carol")  # outside any span: nothing to link to
    clock.advance(0.1)
    contexts, links = rounds.hinted[1]
    assert contexts == {"alice", "bob", "carol"}
    assert {context: [link.context for link in written] for context, written in links.items()} == {
        "alice": alices[:MAX_LINKS],
        "bob": [bob],
    }
    with tracer.start_as_current_span("alice's next write") as span:
        revalidator.wrote("alice")
    clock.advance(0.1)
    assert [link.context for link in rounds.hinted[2][1]["alice"]] == [span.get_span_context()], "a new window"
    assert await rounds.announcements() == rounds.contexts()
