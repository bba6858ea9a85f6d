"""Revalidate on write, decided by the engine (`sidecar.watch.engine.writes`): the debounce is leading-edge, so a lone
write hints at once, a burst is at most two rounds of hints (the first write's, and one for the writes within the
window it opened), and through a watch at most two looks; each round is told to the other replicas; then which
watches a round hints, and the traced writes their polls link to. The engine on a clock the test moves by hand,
with no event loop (`Polled`: its timers fire as the clock moves, its polls look at once); a round is what one
`AnnounceWrites` command tells.

Where a source's hint goes (`HintRouting`): the watches it names, in every context; and what the other replicas
announce, heard here.
"""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.changes import WatchKey, WatchKind
from sidecar.config import PollingConfig
from sidecar.identity import Identity
from sidecar.observability.metrics import Metrics
from sidecar.observability.tracing import MAX_LINKS
from sidecar.watch.engine import Engine, WatchIndex, WritesHeard, Wrote
from sidecar.watch.hint_routing import HintRouting
from sidecar.watch.observation import Observation
from sidecar.watch.rules import Rules
from sidecar.watch.source_hints import SourceHint
from tests.unit.watch.engine_cast import ALICE, BOB
from tests.unit.watch.engine_polls import HELD, Polled, run_spawned
from tests.unit.watch.registry_world import Coordinator

QUIET = PollingConfig(default_interval_ms=600_000, min_interval_ms=10, max_interval_ms=600_000, jitter=0.1)
"""Watches whose next regular poll is ten minutes away: every look a test sees is one a write asked for."""


def _engine(debounce_ms: int = 100) -> Engine:
    config = QUIET.model_copy(update={"revalidate_debounce_ms": debounce_ms})
    return Engine(linger_s=8.0, absent_ttl_s=5.0, rate_per_s=1000.0, rules=Rules([]), polling=config, rand=lambda: 0.5)


def _rounds(debounce_ms: int = 100) -> Polled:
    """An engine that watches nothing: its rounds of writes are what it announces."""
    return Polled(_engine(debounce_ms), lambda key, started: Observation("fp", None, True))


def test_a_lone_write_hints_at_once_and_tells_the_other_replicas() -> None:
    polled = Polled(_engine(debounce_ms=10_000), lambda key, started: Observation("fp", None, False))
    polled.watch(ALICE, "x://notes/alice", Observation("fp", None, False))
    assert polled.clock.advance(1.0) == 0
    polled.feed(Wrote("alice"))
    assert polled.announced == [frozenset({"alice"})]
    polled.clock.advance(0)  # its look is due now
    assert polled.started_at() == [1.0], "no wait for the debounce"


def test_writes_within_the_window_are_one_trailing_round_at_its_end() -> None:
    rounds = _rounds()
    rounds.feed(Wrote("alice"))
    rounds.clock.advance(0.05)
    rounds.feed(Wrote("bob"))
    rounds.feed(Wrote("alice"))
    rounds.clock.advance(0.04995)  # a twentieth of a millisecond before the window ends: still within it
    assert rounds.announced == [frozenset({"alice"})]
    rounds.clock.advance(0.00005)
    assert rounds.announced == [frozenset({"alice"}), frozenset({"alice", "bob"})]
    rounds.clock.advance(0.1)  # the window the trailing round opened ends with nothing written: no round
    assert len(rounds.announced) == 2
    rounds.feed(Wrote("carol"))  # quiet again: at once
    assert rounds.announced[-1] == frozenset({"carol"}) and len(rounds.announced) == 3


def test_a_burst_within_the_window_is_at_most_two_rounds_however_many_writes() -> None:
    rounds = _rounds(debounce_ms=1000)
    for n in range(1000):
        rounds.feed(Wrote(f"ctx-{n % 7}"))
        rounds.clock.advance(0.0009)
    rounds.clock.advance(5.0)
    assert len(rounds.announced) == 2
    assert rounds.announced[1] == frozenset(f"ctx-{n}" for n in range(7))


def test_a_write_after_the_window_closed_is_a_leading_edge_again() -> None:
    rounds = _rounds()
    rounds.feed(Wrote("alice"))
    rounds.clock.advance(0.1)  # the window ends with nothing written within it
    rounds.clock.advance(0.001)
    rounds.feed(Wrote("alice"))
    assert len(rounds.announced) == 2, "not made to wait for a window that ended"


def test_a_write_just_before_shutdown_hints_nothing_afterwards() -> None:
    rounds = _rounds()
    rounds.feed(Wrote("alice"))
    rounds.feed(Wrote("bob"))  # waits for the window's end
    rounds.engine.close()
    rounds.engine.close()  # twice is harmless
    rounds.clock.advance(1.0)  # the window's timer, had the driver not cancelled it, finds nothing to do
    assert rounds.announced == [frozenset({"alice"})], "one round: one announcement"


# -- through a watch: the looks a burst of writes costs -------------------------------------------------------

DOC = "x://1"


def test_a_burst_of_writes_costs_a_watch_at_most_two_looks_and_the_first_is_at_once() -> None:
    polled = Polled(_engine(), lambda key, started: HELD)  # every look is held open until the test answers it
    clock = polled.clock
    key = polled.watch(ALICE, DOC, Observation("fp-0", None, True))  # no ttlMs: the next poll is ten minutes away
    assert clock.advance(1.0) == 0  # well past min_interval_ms since the baseline
    polled.feed(Wrote("alice"))
    clock.advance(0)
    assert polled.started_at() == [1.0], "the first write of a quiet key looks at once"
    for _ in range(50):  # writes while that look is in flight, and within the window
        polled.feed(Wrote("alice"))
        clock.advance(0.01)
    assert len(polled.polls) == 1, "never two looks of one watch at once"
    polled.finish(key, Observation("fp-0", None, True))  # the look ends: the watch arms its next one
    clock.advance(5.0)
    assert len(polled.polls) == 2, "one trailing look for the whole burst, never one per write"
    assert polled.polls[1].hinted and polled.polls[1].at == pytest.approx(1.5, abs=0.05), "soon after the first"
    polled.finish(key, Observation("fp-0", None, True))
    assert min(clock.due()) > 60.0, "the next look is the regular one, ten minutes on: no look left per write"
    assert polled.told() == [], "nothing changed"


# -- which watches a round hints -------------------------------------------------------------------------------


class _Watched:
    """Four watches: a public resource, alice's and bob's own notes, and bob's tools list; every look recorded."""

    def __init__(self) -> None:
        self.looked: list[WatchKey] = []
        self.polled = Polled(_engine(), self._look)
        self.public_doc = self._watch(ALICE, "x://doc", public=True)
        self.alices = self._watch(ALICE, "x://notes/alice")
        self.bobs = self._watch(BOB, "x://notes/bob")
        self.tools = self._watch(BOB, None, kind="tools_list")
        assert self.polled.clock.advance(1.0) == 0  # past min_interval_ms: a hinted watch's look is due at once

    def feed(self, event: Wrote | WritesHeard) -> None:
        self.polled.feed(event)
        self.polled.clock.advance(0.01)  # the hinted looks, spaced a moment apart, all due within the window

    def _look(self, key: WatchKey, started: float) -> Observation:
        self.looked.append(key)
        return Observation("fp", None, key.context == "public")

    def _watch(self, who: Identity, uri: str | None, *, public: bool = False, kind: WatchKind = "resource") -> WatchKey:
        return self.polled.watch(who, uri, Observation("fp", None, public), kind)

    def links(self) -> dict[WatchKey, tuple[Any, ...]]:
        return {linked.key: linked.links for linked in self.polled.linked}


@pytest.mark.invariant(22)
def test_a_write_hints_the_public_watches_and_the_writers_own_warm_and_tells_the_other_replicas() -> None:
    watched = _Watched()
    watched.feed(Wrote("alice"))
    assert watched.looked == [watched.public_doc, watched.alices], "not bob's: a hint, never a change"
    assert all(poll.hinted for poll in watched.polled.polls)
    assert watched.polled.announced == [frozenset({"alice"})]
    assert watched.polled.told() == [], "looked, and nothing changed: nothing told"


@pytest.mark.invariant(22)
def test_writes_another_replica_announces_hint_the_same_watches_here_and_are_not_announced_again() -> None:
    watched = _Watched()
    watched.feed(WritesHeard(frozenset({"bob"})))
    assert sorted(watched.looked, key=str) == sorted([watched.public_doc, watched.bobs, watched.tools], key=str)
    assert watched.polled.announced == [], "heard from the others: theirs to tell"


def test_each_round_of_hints_links_each_contexts_traced_writes_up_to_max_links() -> None:
    watched = _Watched()
    polled = watched.polled
    polled.feed(Wrote("carol", "carol's write"))  # the leading edge: its round links its own write (carol's watches)
    assert watched.links() == {watched.public_doc: ("carol's write",)}
    polled.linked.clear()
    alices = [f"alice's write {n}" for n in range(MAX_LINKS + 2)]
    for write in alices:
        polled.feed(Wrote("alice", write))
    polled.feed(Wrote("bob", "bob's write"))
    polled.feed(Wrote("dave"))  # outside any span: nothing to link to
    polled.clock.advance(0.1)
    assert polled.announced[-1] == {"alice", "bob", "dave"}
    assert (
        watched.links()
        == {
            watched.public_doc: (*alices[:MAX_LINKS], "bob's write"),  # a public watch: every writer's
            watched.alices: tuple(alices[:MAX_LINKS]),  # a private watch: its own context's only
            watched.bobs: ("bob's write",),
            watched.tools: ("bob's write",),
        }
    )
    polled.linked.clear()
    polled.feed(Wrote("alice", "alice's next write"))
    polled.clock.advance(0.1)
    assert watched.links() == {
        watched.public_doc: ("alice's next write",),
        watched.alices: ("alice's next write",),
    }, "a new window: only its own writes"


# -- where a source's hint goes, and what the others announce (`HintRouting`) ------------------------------------


PUBLIC_DOC = WatchKey("resource", "x://doc", "public")
ALICES = WatchKey("resource", "x://notes/alice", "alice")
BOBS = WatchKey("resource", "x://notes/bob", "bob")
TOOLS = WatchKey("tools_list", None, "bob")


class _Routed:
    """Hint routing over four watches, with the hint it gives each recorded (the registry's seam to its engine)."""

    def __init__(self) -> None:
        self.coordinator = Coordinator()
        self.metrics = Metrics()
        self.hinted: list[tuple[WatchKey, bool]] = []
        self.writes_heard: list[frozenset[str]] = []
        watched = WatchIndex()
        for key in (PUBLIC_DOC, ALICES, BOBS, TOOLS):
            watched.add(key)
        self.routing = HintRouting(
            watched,
            self._hint,
            self.coordinator,
            self.metrics,
            spawn=run_spawned,
            writes_heard=self.writes_heard.append,
        )

    def _hint(self, key: WatchKey, *, warm: bool = False) -> None:
        self.hinted.append((key, warm))

    def hinted_count(self) -> float:
        return self.metrics.registry.get_sample_value("mcp_sidecar_watches_hinted_total") or 0.0


def test_a_source_hint_hints_the_watches_it_names_in_every_context_counted_and_told_to_the_others() -> None:
    routed = _Routed()
    hint = SourceHint(("x://notes/*",), ("tools",))
    assert routed.routing.source(hint) == 3
    assert routed.hinted == [(ALICES, True), (BOBS, True), (TOOLS, True)]
    assert routed.hinted_count() == 3
    assert routed.coordinator.announced == [frozenset({hint.to_bus()})]


def test_what_other_replicas_announce_hints_the_same_watches_here_and_is_not_announced_again() -> None:
    routed = _Routed()
    assert routed.coordinator.others_wrote is not None
    routed.coordinator.others_wrote(frozenset({"bob", SourceHint(("x://doc",)).to_bus()}))
    assert routed.writes_heard == [frozenset({"bob"})], "bob's writes: the engine's to hint (`WritesHeard`)"
    assert routed.hinted == [(PUBLIC_DOC, True)], "the source's hint, here"
    assert routed.coordinator.announced == [], "heard from the others: theirs to tell"
    assert routed.hinted_count() == 1, "the source's hint counted here too"
