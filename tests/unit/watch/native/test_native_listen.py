"""The upstream's own notifications as hints (`sidecar.watch.native`) from a 2026-07-28 upstream: a listen per
context with the context's filter, covering only what the upstream acknowledged, refiltered without a gap (the
new listen acknowledged before the old one closes), and given up when no acknowledgment comes. A scripted
upstream that can push, a clock moved by hand, and waits on what the fakes report
(`tests/unit/watch/native/native_harness.py`).
"""

from __future__ import annotations

import logging

import pytest

from sidecar.changes import WatchKey
from sidecar.protocol.types import JsonObject
from tests.kit import ACK, UPDATED
from tests.unit.watch.native.native_harness import (
    ALICE,
    DEBOUNCE_S,
    DOC,
    OTHER,
    Bench,
    acknowledge_all,
    make_bench,
    warnings_of,
)


async def test_a_modern_upstream_gets_a_listen_with_the_contexts_filter(modern: Bench) -> None:
    modern.watch("resource", OTHER, ALICE)
    modern.watch("resource", DOC, ALICE)
    modern.watch("tools_list", None, ALICE)
    modern.watch("prompts_list", None, ALICE)
    modern.watch("resources_list", None, ALICE)
    await modern.until(lambda: len(modern.covered()) == 5)
    assert modern.upstream.opened[0].identity == ALICE
    assert modern.upstream.opened[0].wanted == {
        "resourceSubscriptions": [DOC, OTHER],
        "toolsListChanged": True,
        "promptsListChanged": True,
        "resourcesListChanged": True,
    }
    assert modern.upstream.calls == [], "a listen subscribes through its filter, not with resources/subscribe"


async def test_the_filter_asks_only_for_what_the_upstream_declares() -> None:
    bench = make_bench("modern", {"resources": {"subscribe": True}, "tools": {"listChanged": True}})
    doc = bench.watch("resource", DOC, ALICE)
    tools = bench.watch("tools_list", None, ALICE)
    prompts = bench.watch("prompts_list", None, ALICE)  # the upstream has no prompts: never asked for
    await bench.until(lambda: doc.native and tools.native)
    bench.native.hold(ALICE, "prompts_list", None)  # the registry holds what the upstream cannot push: no effect
    listen = bench.upstream.opened[0]
    listen.push("notifications/tools/list_changed")
    await bench.idle_after(listen)
    assert bench.clock.due() == [], "nothing to ask the upstream again"
    assert [opened.wanted for opened in bench.upstream.opened] == [
        {"resourceSubscriptions": [DOC], "toolsListChanged": True}
    ]
    assert not prompts.native
    await bench.native.aclose()


async def test_only_what_the_upstream_acknowledged_is_covered(modern: Bench) -> None:
    modern.upstream.honour = lambda wanted: {
        "method": ACK,
        "params": {"notifications": {"resourceSubscriptions": [DOC, 7], "toolsListChanged": "yes"}},
    }
    doc = modern.watch("resource", DOC, ALICE)
    other = modern.watch("resource", OTHER, ALICE)
    tools = modern.watch("tools_list", None, ALICE)
    await modern.until(lambda: doc.native)  # what the ack covers is decided at once
    assert modern.covered() == {doc.key}
    assert modern.hints() == {doc.key: 1}
    assert not other.native and not tools.native


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
async def test_a_first_message_that_is_no_acknowledgment_covers_nothing(modern: Bench, first: JsonObject) -> None:
    modern.upstream.honour = lambda wanted: first
    tools = modern.watch("tools_list", None, ALICE)
    await modern.until(lambda: modern.gauge("mcp_sidecar_native_streams") == 1)  # open, and what it covers decided
    assert modern.upstream.open, "the listen stays open (its notifications still hint)"
    assert modern.covered() == set() and not tools.native


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


async def test_a_context_that_stops_watching_what_the_upstream_can_push_closes_its_listen(modern: Bench) -> None:
    doc = modern.watch("resource", DOC, ALICE)
    tools = modern.watch("tools_list", None, ALICE)
    await modern.until(lambda: doc.native and tools.native)
    modern.native.drop("alice", "resource", DOC)
    await modern.timer_at(DEBOUNCE_S)
    modern.clock.advance(DEBOUNCE_S)
    await modern.until(lambda: [opened.wanted for opened in modern.upstream.open] == [{"toolsListChanged": True}])
    modern.native.drop("alice", "tools_list", None)
    await modern.until(lambda: modern.upstream.open == [] and modern.covered() == set())
    await modern.until(lambda: modern.gauge("mcp_sidecar_native_streams") == 0)


async def test_a_listen_acknowledged_then_ended_again_and_again_backs_off(modern: Bench) -> None:
    doc = modern.watch("resource", DOC, ALICE)
    await modern.until(lambda: doc.native)
    waits = []
    for _ in range(4):
        modern.upstream.open[0].end()
        await modern.until(lambda: modern.upstream.open == [] and len(modern.clock.due()) == 1)
        before = modern.clock.now()
        modern.clock.fire_next()
        await modern.until(lambda: len(modern.upstream.open) == 1 and doc.native)
        waits.append(modern.clock.now() - before)
    assert waits == [0.5, 1.0, 2.0, 4.0], "not a reconnect every half second"


async def test_a_context_watching_again_while_its_last_stream_closes_gets_a_stream_of_its_own(
    modern: Bench,
) -> None:
    doc = modern.watch("resource", DOC, ALICE)
    await modern.until(lambda: doc.native)
    modern.native.drop("alice", "resource", DOC)
    modern.native.hold(ALICE, "resource", DOC)  # before the closing stream's task has run
    await modern.until(
        lambda: (
            [opened.closed.is_set() for opened in modern.upstream.opened] == [True, False]
            and doc.native
            and modern.gauge("mcp_sidecar_native_streams") == 1
        )
    )
    doc.hints = 0
    modern.upstream.open[0].push(UPDATED, {"uri": DOC})
    await modern.idle_after(modern.upstream.open[0])
    assert doc.hints == 1
