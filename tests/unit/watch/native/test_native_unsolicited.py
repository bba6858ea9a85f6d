"""Notifications a child process sends on its own, declared or not (`sidecar.watch.native`): the reference SQLite
server sends `notifications/resources/updated` without declaring `resources.subscribe`. Heard on the child's one
channel (the bench's `PushingUpstream.send`), each is a warm hint for every context's watch of its key, and covers
nothing; a 2025-11-25 stream open on the child hears the same message, so it is not taken twice. The rules as
playbooks (`native_book.py`); what reaches the watches, and the child's channel let go of, on the bench.
"""

from __future__ import annotations

from sidecar.config import PollingConfig
from sidecar.watch.native_events import HintWatching, Received, Unsolicited
from tests.kit import UPDATED
from tests.unit.watch.native.native_book import book, subscribed
from tests.unit.watch.native.native_harness import ALICE, BOB, CONFIG, DOC, OTHER, make_bench

UNDECLARED = {"resources": {}, "tools": {}, "prompts": {}}
TOOLS = "notifications/tools/list_changed"


def test_an_undeclared_resources_updated_hints_every_contexts_watch_of_it_and_covers_nothing() -> None:
    bench = make_bench("legacy", UNDECLARED)  # nothing to push: no stream's task, no loop needed
    alice = bench.watch("resource", DOC, ALICE)
    bob = bench.watch("resource", DOC, BOB)
    public = bench.watch("resource", DOC, ALICE, public=True)
    other = bench.watch("resource", OTHER, ALICE)
    bench.upstream.send(UPDATED, {"uri": DOC})
    assert bench.hints() == {alice.key: 1, bob.key: 1, public.key: 1}
    assert alice.warm_hints == bob.warm_hints == public.warm_hints == 1, "a write announced: the watch stays warm"
    assert other.hints == 0 and bench.covered() == set(), "nothing is covered: each keeps its usual interval"
    assert bench.upstream.opened == [], "no stream is opened on a guess"
    assert bench.gauge("mcp_sidecar_upstream_notifications_total", method=UPDATED) == 1


def test_an_undeclared_list_change_hints_that_lists_watches_and_other_messages_nothing() -> None:
    play = book()
    play.step(Unsolicited({"method": TOOLS}, modern=True), Received(TOOLS), HintWatching("tools_list", None))
    play.step(Unsolicited({"method": "notifications/message", "params": {"level": "info", "data": "saved"}}, True))
    play.step(Unsolicited({"method": UPDATED, "params": {"uri": 7}}, modern=True))
    play.step(Unsolicited({"method": UPDATED}, modern=True))


def test_a_legacy_stream_open_on_the_child_hears_it_itself_and_it_is_taken_once() -> None:
    play = book()
    subscribed(play, 1, ALICE, DOC)
    play.step(Unsolicited({"method": UPDATED, "params": {"uri": DOC}}, modern=False))  # the stream hears this one


async def test_with_native_notifications_off_nothing_is_heard_and_closing_stops_hearing() -> None:
    off = make_bench("legacy", UNDECLARED, PollingConfig(native_notifications=False))
    doc = off.watch("resource", DOC, ALICE)
    assert off.upstream.listeners == []
    off.upstream.send(UPDATED, {"uri": DOC})
    assert doc.hints == 0
    await off.native.aclose()
    on = make_bench("legacy", UNDECLARED, CONFIG)
    assert len(on.upstream.listeners) == 1
    await on.native.aclose()
    assert on.upstream.listeners == [], "the child's channel is not held past shutdown"
