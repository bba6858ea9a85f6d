"""The upstream's own notifications as hints (`sidecar.watch.native`) from a 2026-07-28 upstream: a listen per
context with the context's filter, covering only what the upstream acknowledged, refiltered without a gap (the
new listen acknowledged before the old one closes), and given up when no acknowledgment comes. The rules as
playbooks (`native_book.py`); the listens themselves (one opened before the other closes, the acknowledgment waited
for on the clock, a listen ending before it) on a scripted upstream that can push, with a clock moved by hand
(`native_harness.py`).
"""

from __future__ import annotations

import logging

import pytest

from sidecar.changes import WatchKey, WatchKind
from sidecar.protocol.types import JsonObject
from sidecar.watch.native_events import (
    Acknowledged,
    Began,
    Debounce,
    Debounced,
    Dropped,
    Heard,
    Held,
    Listen,
    Log,
    Probe,
    Probed,
    Received,
    Retry,
    RetryDue,
    Start,
    Stop,
    Stopped,
    StreamEnded,
    StreamsOpen,
    Wait,
    Wake,
    Woken,
)
from sidecar.watch.native_rules import ENDED, FAILED
from tests.kit import ACK, UPDATED
from tests.unit.watch.native.native_book import (
    acked,
    book,
    cover,
    hint,
    listened,
    listening,
    listening_to_doc_and_tools,
)
from tests.unit.watch.native.native_harness import (
    ALICE,
    DEBOUNCE_S,
    DOC,
    EVERYTHING,
    OTHER,
    Bench,
    acknowledge_all,
    make_bench,
    warnings_of,
)

TOOLS = "notifications/tools/list_changed"


def test_a_modern_upstream_gets_a_listen_with_the_contexts_filter() -> None:
    play = book()
    play.step(Held(ALICE, "resource", OTHER, EVERYTHING), Start(1, ALICE))  # opened with alice's credential
    more: list[tuple[WatchKind, str | None]] = [("resource", DOC), ("tools_list", None), ("prompts_list", None)]
    for kind, uri in [*more, ("resources_list", None)]:
        play.step(Held(ALICE, kind, uri, EVERYTHING), Wake(1))
    play.step(Began(1), Probe(1))
    wanted = {
        "resourceSubscriptions": [DOC, OTHER],
        "toolsListChanged": True,
        "promptsListChanged": True,
        "resourcesListChanged": True,
    }
    play.step(Probed(1, True, EVERYTHING), Listen(1, wanted))
    keys = [
        ("prompts_list", None),
        ("resource", DOC),
        ("resource", OTHER),
        ("resources_list", None),
        ("tools_list", None),
    ]
    play.step(  # a listen subscribes through its filter, not with resources/subscribe
        Acknowledged(1, acked(wanted)),
        StreamsOpen(1),
        *[command for kind, uri in keys for command in cover(kind, uri, "alice", own=True, public=True)],
        *[command for kind, uri in keys for command in hint(kind, uri, "alice", warm=False)],
        Wait(1),
    )


def test_the_filter_asks_only_for_what_the_upstream_declares() -> None:
    declared = {"resources": {"subscribe": True}, "tools": {"listChanged": True}}
    play = book()
    play.step(Held(ALICE, "resource", DOC, declared), Start(1, ALICE))
    play.step(Held(ALICE, "tools_list", None, declared), Wake(1))
    play.step(Held(ALICE, "prompts_list", None, declared))  # the upstream has no prompts: never asked for
    listening_to_doc_and_tools(play, declared)
    play.step(Held(ALICE, "prompts_list", None, declared))  # the registry holds what the upstream cannot push
    play.step(Heard(1, {"method": TOOLS}), Received(TOOLS), *hint("tools_list", None, "alice", warm=True))


def test_only_what_the_upstream_acknowledged_is_covered() -> None:
    play = book()
    play.step(Held(ALICE, "resource", DOC, EVERYTHING), Start(1, ALICE))
    play.step(Held(ALICE, "resource", OTHER, EVERYTHING), Wake(1))
    play.step(Held(ALICE, "tools_list", None, EVERYTHING), Wake(1))
    play.step(Began(1), Probe(1))
    wanted = {"resourceSubscriptions": [DOC, OTHER], "toolsListChanged": True}
    play.step(Probed(1, True, EVERYTHING), Listen(1, wanted))
    ack = {"method": ACK, "params": {"notifications": {"resourceSubscriptions": [DOC, 7], "toolsListChanged": "yes"}}}
    play.step(
        Acknowledged(1, ack),  # what the ack covers is decided at once
        StreamsOpen(1),
        *cover("resource", DOC, "alice", own=True, public=True),
        *hint("resource", DOC, "alice", warm=False),
        Wait(1),
    )


@pytest.mark.parametrize(
    "first",
    [
        {"method": "notifications/message", "params": {"notifications": {"toolsListChanged": True}}},
        {"method": ACK},
        {"method": ACK, "params": ["notifications"]},
        {"method": ACK, "params": {"notifications": ["toolsListChanged"]}},
    ],
    ids=["not-an-ack", "no-params", "params-not-an-object", "notifications-not-an-object"],
)
def test_a_first_message_that_is_no_acknowledgment_covers_nothing(first: JsonObject) -> None:
    play = book()
    listening(play, 1, ALICE, "tools_list", None)
    play.step(Acknowledged(1, first), StreamsOpen(1), Wait(1))  # the listen stays open (its notifications still hint)


async def test_a_new_interest_opens_a_new_listen_before_the_old_one_closes(modern: Bench) -> None:
    doc = modern.watch("resource", DOC, ALICE)
    await modern.until(lambda: doc.native)
    first = modern.upstream.opened[0]
    modern.watch("resource", OTHER, ALICE)
    modern.watch("tools_list", None, ALICE)
    await modern.timer_at(DEBOUNCE_S)
    assert len(modern.upstream.opened) == 1, "a burst of interest waits out the debounce"
    assert modern.clock.advance(DEBOUNCE_S / 2) == 0
    assert modern.clock.advance(DEBOUNCE_S / 2) == 1
    await modern.until(lambda: len(modern.covered()) == 3 and first.closed.is_set())
    assert [opened.wanted for opened in modern.upstream.opened] == [
        {"resourceSubscriptions": [DOC]},
        {"resourceSubscriptions": [DOC, OTHER], "toolsListChanged": True},
    ], "one new listen for the whole burst"
    assert modern.upstream.open == [modern.upstream.opened[1]]
    assert modern.gauge("mcp_sidecar_native_streams") == 1, "still one stream for the context"
    assert {opened.identity for opened in modern.upstream.opened} == {ALICE}, "each listen as its context"
    assert modern.upstream.probed_as and set(modern.upstream.probed_as) == {ALICE}, "the era looked at as alice"
    # A 2026-07-28 child's own notification, outside every listen, is not one of those the listens hear: a warm hint.
    modern.upstream.send(UPDATED, {"uri": DOC})
    assert doc.warm_hints == 1


async def test_no_notification_falls_between_the_old_listen_and_the_new_one(modern: Bench) -> None:
    doc = modern.watch("resource", DOC, ALICE)
    await modern.until(lambda: doc.native)
    first = modern.upstream.opened[0]
    acknowledge: list[JsonObject] = []
    modern.upstream.honour = lambda wanted: acknowledge.append(acknowledge_all(wanted))  # held back by the test
    modern.watch("resource", OTHER, ALICE)
    await modern.timer_at(DEBOUNCE_S)
    modern.clock.advance(DEBOUNCE_S)
    await modern.timer_at(DEBOUNCE_S + 10.0)  # the new listen is open, waiting for its acknowledgment
    assert len(modern.upstream.opened) == 2 and not first.closed.is_set(), "the old listen waits for the new ack"
    doc.hints = 0
    first.push(UPDATED, {"uri": DOC})
    await modern.idle_after(first)
    assert doc.hints == 1, "heard on the old listen while the new one is acknowledged"
    modern.upstream.opened[1].queue.put_nowait(acknowledge.pop())
    await modern.until(first.closed.is_set)


async def test_a_listen_without_acknowledgment_is_given_up_and_opened_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bench = make_bench("modern")
    bench.upstream.honour = lambda wanted: None
    bench.watch("resource", DOC, ALICE)
    await bench.timer_at(10.0)
    assert len(bench.upstream.opened) == 1
    caplog.set_level(logging.INFO, logger="sidecar.watch.native")
    assert bench.clock.advance(9.9) == 0
    assert bench.upstream.open, "waits ten seconds for the acknowledgment"
    bench.clock.advance(0.1)
    await bench.timer_at(10.5)  # given up, and the next attempt waits its backoff
    assert bench.upstream.open == [] and bench.covered() == set()
    assert bench.gauge("mcp_sidecar_native_streams") == 0, "a stream never acknowledged was never open"
    assert [(r.getMessage(), getattr(r, "reason", None)) for r in caplog.records] == [
        ("upstream notification stream failed", "no acknowledgment within 10 s")
    ]
    bench.upstream.honour = acknowledge_all
    bench.clock.advance(0.5)
    key = WatchKey("resource", DOC, "alice")
    await bench.until(lambda: len(bench.upstream.opened) == 2 and bench.covered() == {key})
    await bench.native.aclose()
    assert warnings_of(caplog) == []


async def test_a_listen_that_ends_before_its_acknowledgment_is_opened_again(modern: Bench) -> None:
    modern.upstream.honour = lambda wanted: None
    modern.watch("resource", DOC, ALICE)
    await modern.timer_at(10.0)
    modern.upstream.opened[0].end()
    await modern.timer_at(0.5)
    assert modern.upstream.open == []
    modern.upstream.honour = acknowledge_all
    modern.clock.advance(0.5)
    await modern.until(lambda: len(modern.upstream.open) == 1 and len(modern.covered()) == 1)


def test_a_context_that_stops_watching_what_the_upstream_can_push_closes_its_listen() -> None:
    play = book()
    play.step(Held(ALICE, "resource", DOC, EVERYTHING), Start(1, ALICE))
    play.step(Held(ALICE, "tools_list", None, EVERYTHING), Wake(1))
    listening_to_doc_and_tools(play, EVERYTHING)
    play.step(Dropped("alice", "resource", DOC), Wake(1))
    play.step(Woken(1), Debounce(1, DEBOUNCE_S))
    play.at(DEBOUNCE_S).step(Debounced(1, EVERYTHING), Listen(1, {"toolsListChanged": True}))
    play.step(
        Acknowledged(1, acked({"toolsListChanged": True})),
        *cover("resource", DOC, "alice", own=False, public=False),
        Wait(1),
    )
    play.step(Dropped("alice", "tools_list", None), Stop(1))
    play.step(Stopped(1), StreamsOpen(-1), *cover("tools_list", None, "alice", own=False, public=False))


def test_a_listen_acknowledged_then_ended_again_and_again_backs_off() -> None:
    play = book()
    wanted = listening(play, 1, ALICE, "resource", DOC)
    opened = [Acknowledged(1, acked(wanted)), StreamsOpen(1), *cover("resource", DOC, "alice", own=True, public=True)]
    play.step(*opened, *hint("resource", DOC, "alice", warm=False), Wait(1))
    for streak, wait in enumerate([0.5, 1.0, 2.0, 4.0]):  # not a reconnect every half second
        play.step(
            StreamEnded(1),
            *([Log(FAILED, ENDED)] if streak == 0 else []),
            StreamsOpen(-1),
            *cover("resource", DOC, "alice", own=False, public=False),
            Retry(1, wait),
        )
        play.at(play.now + wait).step(RetryDue(1), Probe(1))
        play.step(Probed(1, True, EVERYTHING), Listen(1, wanted))
        play.step(*opened, *hint("resource", DOC, "alice", warm=False), Wait(1))


def test_a_context_watching_again_while_its_last_stream_closes_gets_a_stream_of_its_own() -> None:
    play = book()
    wanted = listened(play)
    play.step(Dropped("alice", "resource", DOC), Stop(1))
    play.step(Held(ALICE, "resource", DOC, EVERYTHING), Start(2, ALICE))  # before the closing stream's task has run
    play.step(Stopped(1), StreamsOpen(-1), *cover("resource", DOC, "alice", own=False, public=False))
    play.step(Began(2), Probe(2))
    play.step(Probed(2, True, EVERYTHING), Listen(2, wanted))
    play.step(
        Acknowledged(2, acked(wanted)),
        StreamsOpen(1),
        *cover("resource", DOC, "alice", own=True, public=True),
        *hint("resource", DOC, "alice", warm=False),
        Wait(2),
    )
    play.step(
        Heard(2, {"method": UPDATED, "params": {"uri": DOC}}),
        Received(UPDATED),
        *hint("resource", DOC, "alice", warm=True),
    )
