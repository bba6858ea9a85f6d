"""The upstream's own notifications as hints (`sidecar.watch.native`) from a 2025-11-25 upstream: the context's
session stream with one subscription per URI, what it covers (only what the upstream honoured), and the hints its
notifications give. The rules as playbooks (`native_book.py`); the subscriptions the upstream refuses or fails, on
a scripted upstream that can push, with a clock moved by hand (`native_harness.py`).
"""

from __future__ import annotations

from typing import cast

import pytest

from sidecar.changes import WatchKind
from sidecar.identity import Identity
from sidecar.protocol.types import JsonObject
from sidecar.watch.native_events import (
    Began,
    Debounce,
    Debounced,
    Dropped,
    Heard,
    Held,
    OpenSession,
    Probe,
    Probed,
    Received,
    SessionOpened,
    Start,
    StreamsOpen,
    Subscribe,
    SubscribeAnswered,
    Unsubscribe,
    Unsubscribed,
    Wait,
    Wake,
    Woken,
)
from tests.kit import UPDATED
from tests.unit.watch.native.native_book import Book, book, cover, hint, subscribed
from tests.unit.watch.native.native_harness import ALICE, BOB, DEBOUNCE_S, DOC, EVERYTHING, OTHER, Bench

# -- 2025-11-25: the context's session stream, URIs subscribed one by one ----------------------------------------


def test_a_legacy_upstream_gets_a_session_stream_and_one_subscription_per_uri_as_the_context() -> None:
    subscribed(
        book(), 1, ALICE, DOC
    )  # a newly covered key is polled once (a change before the subscription would wait)


def test_a_uri_the_upstream_refuses_to_subscribe_stays_polled_and_the_others_are_covered() -> None:
    play = book()
    play.step(Held(ALICE, "resource", DOC, EVERYTHING), Start(1, ALICE))
    play.step(Began(1), Probe(1))
    play.step(Probed(1, False, EVERYTHING), OpenSession(1))
    play.step(SessionOpened(1), StreamsOpen(1), Subscribe(1, DOC))
    play.step(SubscribeAnswered(1, DOC, ok=False), Wait(1))  # refused: what it covers is decided with it
    play.step(Held(ALICE, "resource", OTHER, EVERYTHING), Wake(1))
    play.step(Woken(1), Debounce(1, DEBOUNCE_S))
    play.at(DEBOUNCE_S).step(Debounced(1, EVERYTHING), Subscribe(1, DOC))  # one session stream throughout
    play.step(SubscribeAnswered(1, DOC, ok=True), Subscribe(1, OTHER))
    play.step(
        SubscribeAnswered(1, OTHER, ok=True),
        *cover("resource", DOC, "alice", own=True, public=True),
        *cover("resource", OTHER, "alice", own=True, public=True),
        *hint("resource", DOC, "alice", warm=False),
        *hint("resource", OTHER, "alice", warm=False),
        Wait(1),
    )


def test_a_legacy_upstream_without_subscribe_covers_only_the_lists_it_announces() -> None:
    declared = {"resources": {"listChanged": True}, "tools": {"listChanged": True}, "prompts": {}}
    play = book()
    play.step(Held(ALICE, "tools_list", None, declared), Start(1, ALICE))
    play.step(Held(ALICE, "prompts_list", None, declared))
    play.step(Held(ALICE, "resources_list", None, declared), Wake(1))
    play.step(Held(ALICE, "resource", DOC, declared))  # no subscription where the upstream declares none
    play.step(Began(1), Probe(1))
    play.step(Probed(1, False, declared), OpenSession(1))
    play.step(  # one look at what is held, all at once
        SessionOpened(1),
        StreamsOpen(1),
        *cover("resources_list", None, "alice", own=True, public=True),
        *cover("tools_list", None, "alice", own=True, public=True),
        *hint("resources_list", None, "alice", warm=False),
        *hint("tools_list", None, "alice", warm=False),
        Wait(1),
    )


def _both_subscribed(play: Book) -> None:
    """Alice holds DOC and OTHER: both subscribed to on her session stream, and covered."""
    play.step(Held(ALICE, "resource", DOC, EVERYTHING), Start(1, ALICE))
    play.step(Held(ALICE, "resource", OTHER, EVERYTHING), Wake(1))
    play.step(Began(1), Probe(1))
    play.step(Probed(1, False, EVERYTHING), OpenSession(1))
    play.step(SessionOpened(1), StreamsOpen(1), Subscribe(1, DOC))
    play.step(SubscribeAnswered(1, DOC, ok=True), Subscribe(1, OTHER))
    play.step(
        SubscribeAnswered(1, OTHER, ok=True),
        *cover("resource", DOC, "alice", own=True, public=True),
        *cover("resource", OTHER, "alice", own=True, public=True),
        *hint("resource", DOC, "alice", warm=False),
        *hint("resource", OTHER, "alice", warm=False),
        Wait(1),
    )


def test_dropping_a_uri_unsubscribes_it_upstream_and_uncovers_it() -> None:
    play = book()
    _both_subscribed(play)
    play.step(Dropped("alice", "resource", DOC), Wake(1))
    play.step(Woken(1), Debounce(1, DEBOUNCE_S))
    play.at(DEBOUNCE_S).step(Debounced(1, EVERYTHING), Unsubscribe(1, DOC))
    play.step(Unsubscribed(1, DOC), *cover("resource", DOC, "alice", own=False, public=False), Wait(1))


async def test_one_uri_refused_does_not_keep_the_others_from_being_subscribed(legacy: Bench) -> None:
    legacy.upstream.refused_uris = {DOC}
    doc = legacy.watch("resource", DOC, ALICE)
    other = legacy.watch("resource", OTHER, ALICE)
    await legacy.until(lambda: other.native)
    assert [call[1] for call in legacy.upstream.calls] == [DOC, OTHER]
    assert not doc.native


async def test_a_session_stream_subscribes_and_unsubscribes_as_its_context_and_a_failed_unsubscribe_still_uncovers(
    legacy: Bench,
) -> None:
    doc = legacy.watch("resource", DOC, ALICE)
    other = legacy.watch("resource", OTHER, ALICE)
    await legacy.until(lambda: doc.native and other.native)
    assert [(opened.identity, opened.wanted) for opened in legacy.upstream.opened] == [(ALICE, {})]
    public = legacy.watch("resource", DOC, BOB, public=True)  # a new watch of a key the upstream covers already
    assert public.native, "covered from its start: alice's stream covers DOC for everyone"
    await legacy.until(lambda: len(legacy.upstream.calls) == 3)  # bob's own stream subscribes, as bob
    carol = Identity("carol", (("authorization", "Bearer c"),), client="carol-laptop")
    legacy.watch("resource", DOC, carol)  # a third context: past max_native_streams (2), it stays polled
    assert legacy.gauge("mcp_sidecar_limit_rejections_total", limit="native_streams") == 1
    legacy.upstream.open[0].push(UPDATED, {"uri": OTHER})
    await legacy.until(lambda: other.warm_hints == 1)  # the upstream said so: a warm hint
    legacy.upstream.errors["resources/unsubscribe"] = {"code": -32603, "message": "boom"}
    legacy.native.drop("alice", "resource", DOC)
    await legacy.timer_at(DEBOUNCE_S)
    legacy.clock.advance(DEBOUNCE_S)
    await legacy.until(lambda: not doc.native)
    assert legacy.upstream.calls == [
        ("resources/subscribe", DOC, "alice"),
        ("resources/subscribe", OTHER, "alice"),
        ("resources/subscribe", DOC, "bob"),
        ("resources/unsubscribe", DOC, "alice"),
    ]
    assert legacy.upstream.open and other.native, "the stream goes on, and what it still covers stays covered"


# -- what the notifications hint ------------------------------------------------------------------------------


def test_a_resource_update_hints_that_contexts_watch_and_the_public_one() -> None:
    play = book()
    subscribed(play, 1, ALICE, DOC)
    play.step(Held(ALICE, "resource", DOC, EVERYTHING), Wake(1))  # alice's watch of the public key
    subscribed(play, 2, BOB, DOC)
    play.step(  # not bob's: his stream says what he sees
        Heard(1, {"method": UPDATED, "params": {"uri": DOC}}),
        Received(UPDATED),
        *hint("resource", DOC, "alice", warm=True),
    )


@pytest.mark.parametrize(
    "method",
    ["notifications/tools/list_changed", "notifications/prompts/list_changed", "notifications/resources/list_changed"],
)
def test_a_list_changed_hints_that_list(method: str) -> None:
    play = book()
    play.step(Held(ALICE, "tools_list", None, EVERYTHING), Start(1, ALICE))
    play.step(Held(ALICE, "prompts_list", None, EVERYTHING), Wake(1))
    play.step(Held(ALICE, "resources_list", None, EVERYTHING), Wake(1))
    play.step(Began(1), Probe(1))
    play.step(Probed(1, False, EVERYTHING), OpenSession(1))
    lists: list[WatchKind] = ["prompts_list", "resources_list", "tools_list"]
    play.step(
        SessionOpened(1),
        StreamsOpen(1),
        *[command for kind in lists for command in cover(kind, None, "alice", own=True, public=True)],
        *[command for kind in lists for command in hint(kind, None, "alice", warm=False)],
        Wait(1),
    )
    kind = cast(WatchKind, method.split("/")[1] + "_list")
    play.step(Heard(1, {"method": method}), Received(method), *hint(kind, None, "alice", warm=True))


@pytest.mark.parametrize(
    "message",
    [
        {"method": UPDATED, "params": {"uri": 7}},
        {"method": UPDATED, "params": {}},
        {"method": UPDATED, "params": [DOC]},
        {"method": UPDATED},
        {"method": "notifications/message", "params": {"uri": DOC}},
        {"params": {"uri": DOC}},
    ],
    ids=["uri-not-a-string", "no-uri", "params-not-an-object", "no-params", "another-method", "no-method"],
)
def test_a_notification_that_names_no_change_hints_nothing(message: JsonObject) -> None:
    play = book()
    subscribed(play, 1, ALICE, DOC)
    play.step(Heard(1, message))  # not counted, and the stream goes on
    play.step(  # an update of a key nobody here watches: counted, its hints reach no watch
        Heard(1, {"method": UPDATED, "params": {"uri": OTHER}}),
        Received(UPDATED),
        *hint("resource", OTHER, "alice", warm=True),
    )


def test_a_session_on_an_upstream_that_no_longer_declares_subscribe_subscribes_to_nothing() -> None:
    play = book()
    play.step(Held(ALICE, "resource", DOC, EVERYTHING), Start(1, ALICE))
    play.step(Began(1), Probe(1))
    # Probed afresh (after an outage, say), the upstream no longer declares `resources.subscribe`: the session
    # stream opens and hears what it is sent, but no URI is subscribed to, so none is covered.
    play.step(Probed(1, False, {"resources": {}}), OpenSession(1))
    play.step(SessionOpened(1), StreamsOpen(1), Wait(1))
