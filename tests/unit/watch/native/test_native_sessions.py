"""The upstream's own notifications as hints (`sidecar.watch.native`) from a 2025-11-25 upstream: the context's
session stream with one subscription per URI, what it covers (only what the upstream honoured), and the hints its
notifications give. A scripted upstream that can push, a clock moved by hand, and waits on what the fakes report
(`tests/unit/watch/native/native_harness.py`).
"""

from __future__ import annotations

from typing import cast

import pytest

from sidecar.changes import WatchKind
from sidecar.protocol.types import JsonObject
from tests.kit import UPDATED
from tests.unit.watch.native.native_harness import ALICE, BOB, DEBOUNCE_S, DOC, OTHER, Bench, make_bench

# -- 2025-11-25: the context's session stream, URIs subscribed one by one ----------------------------------------


async def test_a_legacy_upstream_gets_a_session_stream_and_one_subscription_per_uri_as_the_context(
    legacy: Bench,
) -> None:
    doc = legacy.watch("resource", DOC, ALICE)
    await legacy.until(lambda: doc.native)
    assert [(opened.identity, opened.wanted) for opened in legacy.upstream.opened] == [(ALICE, {})]
    assert legacy.upstream.calls == [("resources/subscribe", DOC, "alice")]
    assert len(legacy.covered()) == 1
    assert legacy.gauge("mcp_sidecar_native_streams") == 1
    assert doc.hints == 1, "a newly covered key is polled once (a change before the subscription would wait)"


async def test_a_uri_the_upstream_refuses_to_subscribe_stays_polled_and_the_others_are_covered(
    legacy: Bench,
) -> None:
    legacy.upstream.errors["resources/subscribe"] = {"code": -32602, "message": "no such resource"}
    doc = legacy.watch("resource", DOC, ALICE)
    await legacy.until(lambda: len(legacy.upstream.calls) == 1)  # refused: what it covers is decided with it
    assert not doc.native and doc.hints == 0
    del legacy.upstream.errors["resources/subscribe"]
    other = legacy.watch("resource", OTHER, ALICE)
    await legacy.timer_at(DEBOUNCE_S)
    legacy.clock.advance(DEBOUNCE_S)
    await legacy.until(lambda: other.native and doc.native)
    assert [call for call in legacy.upstream.calls if call[1] == OTHER] == [("resources/subscribe", OTHER, "alice")]
    assert len(legacy.upstream.opened) == 1, "one session stream throughout"


async def test_a_legacy_upstream_without_subscribe_covers_only_the_lists_it_announces() -> None:
    bench = make_bench("legacy", {"resources": {"listChanged": True}, "tools": {"listChanged": True}, "prompts": {}})
    tools = bench.watch("tools_list", None, ALICE)
    prompts = bench.watch("prompts_list", None, ALICE)
    resources = bench.watch("resources_list", None, ALICE)
    doc = bench.watch("resource", DOC, ALICE)
    await bench.until(lambda: bench.covered() == {tools.key, resources.key})  # one look at what is held, all at once
    assert not prompts.native and not doc.native
    assert bench.upstream.calls == [], "no subscription where the upstream declares none"
    await bench.native.aclose()


async def test_dropping_a_uri_unsubscribes_it_upstream_and_uncovers_it(legacy: Bench) -> None:
    doc = legacy.watch("resource", DOC, ALICE)
    other = legacy.watch("resource", OTHER, ALICE)
    await legacy.until(lambda: legacy.covered() == {doc.key, other.key})
    legacy.upstream.calls.clear()
    legacy.native.drop("alice", "resource", DOC)
    await legacy.timer_at(DEBOUNCE_S)
    legacy.clock.advance(DEBOUNCE_S)
    await legacy.until(lambda: legacy.covered() == {other.key})
    assert legacy.upstream.calls == [("resources/unsubscribe", DOC, "alice")]
    assert len(legacy.covered()) == 1


async def test_one_uri_refused_does_not_keep_the_others_from_being_subscribed(legacy: Bench) -> None:
    legacy.upstream.refused_uris = {DOC}
    doc = legacy.watch("resource", DOC, ALICE)
    other = legacy.watch("resource", OTHER, ALICE)
    await legacy.until(lambda: other.native)
    assert [call[1] for call in legacy.upstream.calls] == [DOC, OTHER]
    assert not doc.native


async def test_an_unsubscribe_the_upstream_fails_still_uncovers_the_uri(legacy: Bench) -> None:
    doc = legacy.watch("resource", DOC, ALICE)
    other = legacy.watch("resource", OTHER, ALICE)
    await legacy.until(lambda: doc.native and other.native)
    legacy.upstream.errors["resources/unsubscribe"] = {"code": -32603, "message": "boom"}
    legacy.native.drop("alice", "resource", DOC)
    await legacy.timer_at(DEBOUNCE_S)
    legacy.clock.advance(DEBOUNCE_S)
    await legacy.until(lambda: not doc.native)
    assert legacy.upstream.open, "the stream goes on"


# -- what the notifications hint ------------------------------------------------------------------------------


async def test_a_resource_update_hints_that_contexts_watch_and_the_public_one(legacy: Bench) -> None:
    own = legacy.watch("resource", DOC, ALICE)
    public = legacy.watch("resource", DOC, ALICE, public=True)
    bobs = legacy.watch("resource", DOC, BOB)
    await legacy.until(lambda: own.native and public.native and bobs.native)
    legacy.clear_hints()
    alices = next(opened for opened in legacy.upstream.opened if opened.identity == ALICE)
    alices.push(UPDATED, {"uri": DOC})
    await legacy.idle_after(alices)
    assert legacy.hints() == {own.key: 1, public.key: 1}, "not bob's: his stream says what he sees"
    assert bobs.hints == 0
    assert legacy.gauge("mcp_sidecar_upstream_notifications_total", method=UPDATED) == 1


@pytest.mark.parametrize(
    "method",
    ["notifications/tools/list_changed", "notifications/prompts/list_changed", "notifications/resources/list_changed"],
)
async def test_a_list_changed_hints_that_list(legacy: Bench, method: str) -> None:
    lists = {kind: legacy.watch(kind, None, ALICE) for kind in ("tools_list", "prompts_list", "resources_list")}
    await legacy.until(lambda: all(watch.native for watch in lists.values()))
    legacy.clear_hints()
    legacy.upstream.opened[0].push(method)
    await legacy.idle_after(legacy.upstream.opened[0])
    kind = cast(WatchKind, method.split("/")[1] + "_list")
    assert legacy.hints() == {lists[kind].key: 1}
    assert legacy.gauge("mcp_sidecar_upstream_notifications_total", method=method) == 1


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
async def test_a_notification_that_names_no_change_hints_nothing(legacy: Bench, message: JsonObject) -> None:
    doc = legacy.watch("resource", DOC, ALICE)
    await legacy.until(lambda: doc.native)
    doc.hints = 0
    stream = legacy.upstream.opened[0]
    stream.queue.put_nowait(message)
    stream.push(UPDATED, {"uri": OTHER})  # an update of a key nobody here watches
    await legacy.idle_after(stream)  # both read, and each acted on as it was read
    assert doc.hints == 0
    assert legacy.upstream.open, "the stream goes on"
    counted = legacy.gauge("mcp_sidecar_upstream_notifications_total", method=UPDATED)
    assert counted == 1, "only the well-formed update is counted"
