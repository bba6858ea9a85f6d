"""The write debounce, leading-edge: a lone write hints at once, a burst is at most two rounds of hints (the first
write's, and one for the writes within the window it opened), and through a watch at most two looks; then where
the hints go (`HintRouting`). On a clock the test moves by hand, with no event loop: nothing sleeps, and the
announcements to the other replicas (coroutines the revalidator spawns) are run to their end by the test.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanContext, Tracer

from sidecar.changes import LocalCoordinator, WatchKey
from sidecar.config import PollingConfig
from sidecar.identity import PUBLIC
from sidecar.observability.metrics import Metrics
from sidecar.observability.tracing import MAX_LINKS, Tracing, install
from sidecar.watch.engine import Engine
from sidecar.watch.engine.events import Hinted
from sidecar.watch.hint_routing import HintRouting
from sidecar.watch.observation import Observation
from sidecar.watch.revalidate import Revalidator
from sidecar.watch.rules import Rules
from sidecar.watch.source_hints import SourceHint
from tests.unit.watch.engine_cast import ALICE
from tests.unit.watch.engine_polls import HELD, Polled
from tests.unit.watch.manual_clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def _run(coro: Coroutine[Any, Any, None]) -> None:
    """Run a spawned coroutine to its end with no loop: the coordinators here await nothing, so it never suspends."""
    try:
        coro.send(None)
    except StopIteration:
        return
    coro.close()
    raise AssertionError("a spawned coroutine waited for something")


class _Coordinator(LocalCoordinator):
    """One replica's coordination, as hint routing uses it: what it announces, and its ear for other replicas."""

    def __init__(self) -> None:
        self.announced: list[frozenset[str]] = []
        self.heard: Callable[[frozenset[str]], None] | None = None

    async def announce_revalidate(self, contexts: frozenset[str]) -> None:
        self.announced.append(contexts)

    def on_revalidate(self, listener: Callable[[frozenset[str]], None]) -> None:
        self.heard = listener


class _Rounds:
    """What a Revalidator does: the rounds of hints, and the announcements to other replicas it spawns."""

    def __init__(self) -> None:
        self.hinted: list[tuple[frozenset[str], Mapping[str, tuple[Any, ...]]]] = []
        self.tasks: list[Coroutine[Any, Any, None]] = []
        self.coordinator = _Coordinator()

    def hint(self, contexts: frozenset[str], links: Mapping[str, tuple[Any, ...]]) -> None:
        self.hinted.append((contexts, links))

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(coro)

    def announcements(self) -> list[frozenset[str]]:
        """What the rounds so far told the other replicas, once each announcement spawned has run."""
        while self.tasks:
            _run(self.tasks.pop(0))
        return self.coordinator.announced

    def contexts(self) -> list[frozenset[str]]:
        return [contexts for contexts, _ in self.hinted]

    def revalidator(self, clock: ManualClock, debounce_ms: int = 100) -> Revalidator:
        return Revalidator(debounce_ms, self.coordinator, self.hint, self.spawn, clock)


def test_a_lone_write_hints_at_once_and_tells_the_other_replicas(clock: ManualClock) -> None:
    rounds = _Rounds()
    revalidator = rounds.revalidator(clock, debounce_ms=10_000)
    revalidator.wrote("alice")
    assert rounds.contexts() == [frozenset({"alice"})], "no wait for the debounce"
    assert rounds.announcements() == [frozenset({"alice"})]


def test_writes_within_the_window_are_one_trailing_round_at_its_end(clock: ManualClock) -> None:
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
    assert rounds.announcements() == rounds.contexts()
    clock.advance(0.1)  # the window the trailing round opened ends with nothing written: no round
    assert len(rounds.hinted) == 2
    revalidator.wrote("carol")  # quiet again: at once
    assert rounds.contexts()[-1] == frozenset({"carol"}) and len(rounds.hinted) == 3
    assert rounds.announcements() == rounds.contexts()


def test_a_burst_within_the_window_is_at_most_two_rounds_however_many_writes(clock: ManualClock) -> None:
    rounds = _Rounds()
    revalidator = rounds.revalidator(clock, debounce_ms=1000)
    for n in range(1000):
        revalidator.wrote(f"ctx-{n % 7}")
        clock.advance(0.0009)
    clock.advance(5.0)
    assert len(rounds.hinted) == 2
    assert rounds.contexts()[1] == frozenset(f"ctx-{n}" for n in range(7))
    assert rounds.announcements() == rounds.contexts()


def test_a_write_after_the_window_closed_is_a_leading_edge_again(clock: ManualClock) -> None:
    rounds = _Rounds()
    revalidator = rounds.revalidator(clock)
    revalidator.wrote("alice")
    clock.advance(0.1)  # the window ends with nothing written within it
    clock.advance(0.001)
    revalidator.wrote("alice")
    assert len(rounds.hinted) == 2, "not made to wait for a window that ended"
    assert rounds.announcements() == rounds.contexts()


def test_a_write_just_before_shutdown_hints_nothing_afterwards(clock: ManualClock) -> None:
    rounds = _Rounds()
    revalidator = rounds.revalidator(clock)
    revalidator.wrote("alice")
    revalidator.wrote("bob")  # waits for the window's end
    revalidator.cancel()
    revalidator.cancel()  # twice is harmless
    clock.advance(1.0)
    assert rounds.contexts() == [frozenset({"alice"})] and len(rounds.tasks) == 1, "one round: one announcement"
    assert rounds.announcements() == [frozenset({"alice"})]


# -- through a watch: the looks a burst of writes costs -------------------------------------------------------

DOC = "x://1"


def test_a_burst_of_writes_costs_a_watch_at_most_two_looks_and_the_first_is_at_once() -> None:
    config = PollingConfig(default_interval_ms=600_000, min_interval_ms=10, max_interval_ms=600_000, jitter=0.1)
    engine = Engine(linger_s=8.0, absent_ttl_s=5.0, rate_per_s=1000.0, rules=Rules([]), polling=config,
                    rand=lambda: 0.5)  # fmt: skip
    polled = Polled(engine, lambda key, started: HELD)  # every look is held open until the test answers it
    clock = polled.clock
    key = polled.watch(ALICE, DOC, Observation("fp-0", None, True))  # no ttlMs: the next poll is ten minutes away

    def hint(key: WatchKey, links: Sequence[Any] = (), *, warm: bool = False) -> None:
        polled.feed(Hinted(key, warm))

    # The registry's route: writes through hint routing's revalidator, to the engine (settle_ms 0, its default).
    routing = HintRouting(lambda: engine.keys(), hint, LocalCoordinator(), Metrics(), debounce_ms=100,
                          spawn=lambda coro: coro.close(), clock=clock)  # fmt: skip
    assert clock.advance(1.0) == 0  # well past min_interval_ms since the baseline
    routing.wrote("alice")
    clock.advance(0)
    assert polled.started_at() == [1.0], "the first write of a quiet key looks at once"
    for _ in range(50):  # writes while that look is in flight, and within the window
        routing.wrote("alice")
        clock.advance(0.01)
    assert len(polled.polls) == 1, "never two looks of one watch at once"
    polled.finish(key, Observation("fp-0", None, True))  # the look ends: the watch arms its next one
    clock.advance(5.0)
    assert len(polled.polls) == 2, "one trailing look for the whole burst, never one per write"
    assert polled.polls[1].hinted and polled.polls[1].at == pytest.approx(1.5, abs=0.05), "soon after the first"
    polled.finish(key, Observation("fp-0", None, True))
    assert min(clock.due()) > 60.0, "the next look is the regular one, ten minutes on: no look left per write"
    assert polled.told() == [], "nothing changed"


# -- where the hints go ---------------------------------------------------------------------------------------

PUBLIC_DOC = WatchKey("resource", "x://doc", PUBLIC)
ALICES = WatchKey("resource", "x://notes/alice", "alice")
BOBS = WatchKey("resource", "x://notes/bob", "bob")
TOOLS = WatchKey("tools_list", None, "bob")


class _Routed:
    """Hint routing over three watches, with the hint it gives each recorded (the registry's seam to its engine)."""

    def __init__(self, clock: ManualClock) -> None:
        self.coordinator = _Coordinator()
        self.metrics = Metrics()
        self.hinted: list[tuple[WatchKey, tuple[Any, ...], bool]] = []
        self.spawned: list[Coroutine[Any, Any, None]] = []
        self.routing = HintRouting(
            lambda: [PUBLIC_DOC, ALICES, BOBS, TOOLS],
            self._hint,
            self.coordinator,
            self.metrics,
            debounce_ms=100,
            spawn=self.spawned.append,
            clock=clock,
        )

    def _hint(self, key: WatchKey, links: Sequence[Any] = (), *, warm: bool = False) -> None:
        self.hinted.append((key, tuple(links), warm))

    def announced(self) -> list[frozenset[str]]:
        for coro in self.spawned:
            _run(coro)
        self.spawned.clear()
        return self.coordinator.announced

    def hinted_count(self) -> float:
        return self.metrics.registry.get_sample_value("mcp_sidecar_watches_hinted_total") or 0.0


@pytest.mark.invariant(22)
def test_a_write_hints_the_public_watches_and_the_writers_own_warm_and_tells_the_other_replicas(
    clock: ManualClock,
) -> None:
    routed = _Routed(clock)
    routed.routing.wrote("alice")
    assert routed.hinted == [(PUBLIC_DOC, (), True), (ALICES, (), True)], "not bob's: a hint, never a change"
    assert routed.announced() == [frozenset({"alice"})]


def test_a_source_hint_hints_the_watches_it_names_in_every_context_counted_and_told_to_the_others(
    clock: ManualClock,
) -> None:
    routed = _Routed(clock)
    hint = SourceHint(("x://notes/*",), ("tools",))
    assert routed.routing.source(hint) == 3
    assert routed.hinted == [(ALICES, (), True), (BOBS, (), True), (TOOLS, (), True)]
    assert routed.hinted_count() == 3
    assert routed.announced() == [frozenset({hint.to_bus()})]


def test_what_other_replicas_announce_hints_the_same_watches_here_and_is_not_announced_again(
    clock: ManualClock,
) -> None:
    routed = _Routed(clock)
    assert routed.coordinator.heard is not None
    routed.coordinator.heard(frozenset({"bob", SourceHint(("x://doc",)).to_bus()}))
    assert sorted(routed.hinted, key=repr) == sorted(
        [(PUBLIC_DOC, (), True), (BOBS, (), True), (TOOLS, (), True), (PUBLIC_DOC, (), True)], key=repr
    )
    assert routed.announced() == [], "heard from the others: theirs to tell"
    assert routed.hinted_count() == 1, "the source's hint counted here too"


@pytest.fixture
def tracer() -> Iterator[Tracer]:
    provider = TracerProvider()
    previous = install(Tracing(provider.get_tracer("tests"), provider))
    try:
        yield provider.get_tracer("tests")
    finally:
        install(previous)
        provider.shutdown()


def test_each_round_of_hints_links_each_contexts_traced_writes_up_to_max_links(
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
    assert rounds.announcements() == rounds.contexts()


def test_each_watch_a_round_hints_links_the_traced_writes_that_may_concern_it(
    clock: ManualClock, tracer: Tracer
) -> None:
    routed = _Routed(clock)
    routed.routing.wrote("carol")  # untraced, the leading edge: it opens the window the next writes wait in
    written: dict[str, SpanContext] = {}
    for context in ("alice", "bob"):
        with tracer.start_as_current_span(f"{context}'s write") as span:
            routed.routing.wrote(context)
            written[context] = span.get_span_context()
    routed.hinted.clear()
    clock.advance(0.1)
    links = {key: [link.context for link in linked] for key, linked, _ in routed.hinted}
    alice, bob = written["alice"], written["bob"]
    assert links == {PUBLIC_DOC: [alice, bob], ALICES: [alice], BOBS: [bob], TOOLS: [bob]}, "a private watch: its own"
    assert routed.announced() == [frozenset({"carol"}), frozenset({"alice", "bob"})]
