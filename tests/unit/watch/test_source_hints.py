"""Hints from the source: the glob, which watches a hint names, its form on the bus, what the engine makes of one
reaching it by the registry's route (every context's matching watch looks, with its own credential; only a look
that differs is a change), and the registry carrying that out against a scripted upstream.
"""

from __future__ import annotations

import pytest

from sidecar.changes import WatchKey, WatchKind
from sidecar.identity import Identity
from sidecar.observability.metrics import Metrics
from sidecar.watch.engine import Engine, WatchIndex
from sidecar.watch.engine.events import Hinted, WritesHeard
from sidecar.watch.fingerprint import fingerprint_contents, fingerprint_items
from sidecar.watch.hint_routing import HintRouting
from sidecar.watch.observation import Observation
from sidecar.watch.rules import Rules
from sidecar.watch.source_hints import SourceHint, UriGlob, from_bus, targets
from tests.kit import eventually
from tests.unit.watch.engine_polls import Polled, run_spawned
from tests.unit.watch.registry_world import ALICE, BOB, CAROL, CONFIG, DOC, OTHER, Coordinator, make_world
from tests.unit.watch.scripted_upstream import contents

# -- the glob ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("glob", "uri", "matches"),
    [
        ("catalog://price", "catalog://price", True),
        ("catalog://price", "catalog://prices", False),
        ("catalog://plans/*", "catalog://plans/gold", True),
        ("catalog://plans/*", "catalog://plans/", True),  # `*` matches none too
        ("catalog://plans/*", "catalog://plans/a/b", True),  # and any run, slashes included
        ("catalog://plans/*", "catalog://plan", False),
        ("catalog://plans/*", "other://catalog://plans/x", False),  # anchored at the start
        ("*/gold", "catalog://plans/gold", True),
        ("*/gold", "catalog://plans/golden", False),  # anchored at the end
        ("a*b*c", "abc", True),
        ("a*b*c", "a-c-b", False),  # the parts in order
        ("a*b*b", "ab", False),  # a part is not counted twice
        ("ab*ba", "aba", False),  # the first and the last part do not overlap
        ("x*b*b*y", "xby", False),  # nor do two middle parts: each is found after the one before
        ("x*a*a*z", "xaz", False),
        ("x*b*c*y", "xbcby", True),  # each middle part found leftmost, so the later parts still fit after it
        ("*", "", True),
        ("**", "anything", True),
        ("x://?[a]", "x://?[a]", True),  # only * is special
        ("x://?[a]", "x://b[a]", False),
    ],
)
def test_a_glob_matches_any_run_for_each_star_and_nothing_else_is_special(glob: str, uri: str, matches: bool) -> None:
    assert UriGlob(glob).matches(uri) is matches


def test_a_glob_of_many_stars_against_a_long_uri_is_linear() -> None:
    # A backtracking matcher takes exponential time here; this one looks at the URI once a part.
    assert not UriGlob("*a" * 50 + "*b").matches("a" * 10_000)


# -- which watches a hint names --------------------------------------------------------------------------------


def _Keyed(kind: str, uri: str | None, context: str) -> WatchKey:
    return WatchKey(kind, uri, context)  # type: ignore[arg-type]


def test_a_hint_names_every_contexts_watch_of_its_uris_and_the_lists_it_names() -> None:
    watches = [
        _Keyed("resource", "catalog://plans/gold", "public"),
        _Keyed("resource", "catalog://plans/gold", "ctx-alice"),
        _Keyed("resource", "catalog://plans/silver", "ctx-bob"),
        _Keyed("resource", "catalog://price", "ctx-bob"),
        _Keyed("resource", "catalog://other", "public"),
        _Keyed("tools_list", None, "public"),
        _Keyed("tools_list", None, "ctx-bob"),
        _Keyed("prompts_list", None, "public"),
    ]
    index = WatchIndex()
    for watched in watches:
        index.add(watched)
    hint = SourceHint(("catalog://plans/*", "catalog://price", "catalog://plans/gold"), ("tools",))
    named = index.at(targets(hint, index.resource_uris()))
    assert named == watches[:4] + watches[5:7], "each watch once, in the order the watches started"
    assert index.at(targets(SourceHint(("catalog://nothing",)), index.resource_uris())) == []


def test_a_hint_travels_the_bus_as_an_entry_no_context_can_be_and_comes_back_whole() -> None:
    hint = SourceHint(("catalog://plans/*", "x://a b"), ("prompts", "resources"))
    entry = hint.to_bus()
    assert not entry.startswith(("public", "anon", "ctx-"))
    written, hints = from_bus(frozenset({entry, "ctx-alice", "public"}))
    assert written == {"ctx-alice", "public"} and hints == [hint]
    assert from_bus(frozenset({"source-hint:{not json", "anon"})) == (frozenset({"anon"}), [])


def test_an_entry_this_release_cannot_read_hides_nothing_after_it_in_the_announcement() -> None:
    hint = SourceHint(("catalog://plans/1",), ())
    written, hints = from_bus(["source-hint:{not json", "ctx-alice", 'source-hint:{"u": 1}', hint.to_bus()])
    assert written == {"ctx-alice"} and hints == [hint]


# -- a hint through the registry's route (`HintRouting`) to the engine, polled on a hand-moved clock -------------


class _Hinted:
    """Watches on an engine whose polls see `seen` (by URI, or the list's pages) at once, hinted as the registry
    hints them: through hint routing, announcing to the other replicas through `coordinator`."""

    def __init__(self) -> None:
        engine = Engine(linger_s=8.0, absent_ttl_s=5.0, rate_per_s=1000.0, rules=Rules([]), polling=CONFIG,
                        rand=lambda: 0.5)  # fmt: skip
        self.seen: dict[str | None, Observation] = {}
        self.looked: list[WatchKey] = []
        self.polled = Polled(engine, self._look)
        self.clock = self.polled.clock
        self.coordinator = Coordinator()
        self.metrics = Metrics()
        self.routing = HintRouting(
            engine.index,
            self._hint,
            self.coordinator,
            self.metrics,
            spawn=run_spawned,
            writes_heard=lambda contexts: self.polled.feed(WritesHeard(contexts)),
        )

    def _look(self, key: WatchKey, started: float) -> Observation:
        self.looked.append(key)
        return self.seen[key.uri]

    def _hint(self, key: WatchKey, *, warm: bool = False) -> None:
        self.polled.feed(Hinted(key, warm))

    def watch(self, who: Identity, uri: str | None, seen: Observation, kind: WatchKind = "resource") -> WatchKey:
        self.seen[uri] = seen
        return self.polled.watch(who, uri, seen, kind)


def _public(uri: str, text: str) -> Observation:
    return Observation(fingerprint_contents(contents(uri, text)["contents"]), None, True)


@pytest.mark.invariant(22)
def test_a_hint_notifies_only_what_its_look_finds_changed() -> None:
    hinted = _Hinted()
    for uri in (DOC, OTHER):
        hinted.watch(ALICE, uri, _public(uri, "v1"))
    assert hinted.clock.advance(1.0) == 0
    assert hinted.routing.source(SourceHint(("file:///*",))) == 2
    assert hinted.clock.advance(0) == 2, "each hinted watch's look is due at once"
    assert [poll.hinted for poll in hinted.polled.polls] == [True, True]
    assert hinted.polled.told() == [], "both looked, neither changed"
    hinted.seen[OTHER] = _public(OTHER, "v2")
    hinted.clock.advance(0.5)  # past min_interval_ms since those looks
    hinted.routing.source(SourceHint(("file:///*",)))
    assert hinted.clock.advance(0) == 2, "each hinted watch's look is due at once"
    assert [(told.key.uri, told.fingerprint) for told in hinted.polled.published] == [
        (OTHER, _public(OTHER, "v2").fingerprint)
    ], "the look that differs, and only it"


def test_a_hint_heard_from_another_replica_hints_the_matching_watches_here_and_no_others() -> None:
    hinted = _Hinted()
    doc, other = (hinted.watch(CAROL, uri, _public(uri, "v1")) for uri in (DOC, OTHER))
    tools = hinted.watch(CAROL, None, Observation(fingerprint_items([]), None, False), "tools_list")
    assert hinted.clock.advance(1.0) == 0
    assert hinted.coordinator.others_wrote is not None
    hinted.coordinator.others_wrote(frozenset({SourceHint((OTHER,), ("tools",)).to_bus()}))
    assert hinted.clock.advance(0) == 2, "each hinted watch's look is due at once"
    assert sorted(hinted.looked, key=str) == sorted([other, tools], key=str) and doc not in hinted.looked
    assert hinted.polled.engine.poller(tools) == CAROL, "a private list: looked at with its own context's credential"
    assert hinted.coordinator.announced == [], "heard, not announced again"
    assert hinted.metrics.registry.get_sample_value("mcp_sidecar_watches_hinted_total") == 2


# -- the registry ---------------------------------------------------------------------------------------------


async def test_a_hint_makes_each_contexts_watch_look_with_its_own_credential_and_tells_the_other_replicas() -> None:
    coordinator = Coordinator()
    world = make_world(coordinator=coordinator)
    world.upstream.private[(DOC, "alice")] = contents(DOC, "alice's")
    world.upstream.private[(DOC, "bob")] = contents(DOC, "bob's")
    world.upstream.private[(OTHER, "bob")] = contents(OTHER, "bob's other")
    for identity, uri in ((ALICE, DOC), (BOB, DOC), (BOB, OTHER)):
        assert await world.registry.acquire("resource", uri, identity) is not None
    assert world.clock.advance(1.0) == 0
    world.upstream.calls.clear()
    assert world.registry.hearing.source(SourceHint(("file:///d*",))) == 2
    armed = world.clock.armed
    assert world.clock.advance(0) == 2, "each hinted watch's look is due at once"
    await eventually(lambda: world.clock.armed == armed + 2, what="both hinted looks ended and armed their next")
    assert sorted(world.upstream.calls) == [("resources/read", DOC, "alice"), ("resources/read", DOC, "bob")]
    assert coordinator.announced == [frozenset({SourceHint(("file:///d*",)).to_bus()})]
    assert world.changes() == [], "a hint is not a change: the looks saw what was there"
    assert world.gauge("mcp_sidecar_watches_hinted_total") == 2
    await world.registry.aclose()
