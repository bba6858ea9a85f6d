"""The engine's index of its watches: by context and by what they watch, in the order the watches started, and
nothing kept for a context or target once nobody watches it."""

from __future__ import annotations

from sidecar.changes import WatchKey
from sidecar.identity import PUBLIC
from sidecar.watch.engine import WatchIndex

ALICE_DOC = WatchKey("resource", "x://doc", "alice")
BOB_DOC = WatchKey("resource", "x://doc", "bob")
PUBLIC_OTHER = WatchKey("resource", "x://other", PUBLIC)
ALICE_TOOLS = WatchKey("tools_list", None, "alice")
BOB_NOTES = WatchKey("resource", "x://notes/1", "bob")


def _index(*keys: WatchKey) -> WatchIndex:
    index = WatchIndex()
    for key in keys:
        index.add(key)
    return index


def test_lookups_give_each_key_once_in_the_order_the_watches_started_across_contexts_and_targets() -> None:
    index = _index(BOB_DOC, ALICE_TOOLS, PUBLIC_OTHER, ALICE_DOC, BOB_NOTES)
    assert index.of_contexts(["alice", PUBLIC, "alice"]) == [ALICE_TOOLS, PUBLIC_OTHER, ALICE_DOC]
    assert index.of_contexts(["carol"]) == []
    assert index.at([("resource", "x://doc"), ("tools_list", None), ("resource", "x://doc")]) == [
        BOB_DOC,
        ALICE_TOOLS,
        ALICE_DOC,
    ]
    assert sorted(index.resource_uris()) == ["x://doc", "x://notes/1", "x://other"]
    assert index.contexts == 3 and len(index) == 5
    # Two keys from two lookups: whichever order the contexts come in, the one started first comes first.
    for first, second in ((ALICE_TOOLS, BOB_NOTES), (BOB_NOTES, ALICE_TOOLS)):
        assert _index(first, second).of_contexts(["alice", "bob"]) == [first, second]
    gone = WatchKey("resource", "x://gone", "alice")
    assert index.ordered([BOB_NOTES, gone, ALICE_TOOLS, BOB_DOC]) == [BOB_DOC, ALICE_TOOLS, BOB_NOTES]


def test_a_watch_started_again_comes_after_those_that_kept_watching() -> None:
    index = _index(ALICE_DOC, BOB_DOC)
    index.remove(ALICE_DOC)
    index.add(ALICE_DOC)
    assert index.at([("resource", "x://doc")]) == [BOB_DOC, ALICE_DOC]


def test_nothing_is_kept_for_a_context_or_a_target_nobody_watches_any_more() -> None:
    index = _index(ALICE_DOC, BOB_DOC, ALICE_TOOLS)
    index.remove(ALICE_DOC)
    assert index.contexts == 2, "alice still watches the tools list"
    assert index.at([("resource", "x://doc")]) == [BOB_DOC]
    index.remove(ALICE_TOOLS)
    index.remove(BOB_DOC)
    assert index.contexts == 0 and len(index) == 0
    assert list(index.resource_uris()) == [], "a URI nobody watches is matched by no glob"
    for n in range(1000):  # watches come and go: the index does not grow with them
        key = WatchKey("resource", f"x://{n}", f"ctx-{n}")
        index.add(key)
        index.remove(key)
    assert index.contexts == 0 and list(index.resource_uris()) == []
    index.add(ALICE_DOC)
    index.clear()
    assert index.contexts == 0 and len(index) == 0 and index.of_contexts(["alice"]) == []
