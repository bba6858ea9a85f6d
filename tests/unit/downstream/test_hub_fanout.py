"""The listen hub's fan-out with no socket: a change reaches the streams (and 2025-11-25 sessions) that hold its key
and no other, in slices of streams; a refused credential ends only its own context's streams. A real hub and
registry on the in-memory bus and the hand-moved clock; what each client reads is what the tests assert."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sidecar.changes import WatchKey
from sidecar.downstream.legacy_session import LegacySession
from sidecar.identity import PUBLIC
from sidecar.protocol.frames import complete_result, notification
from tests.kit import UPDATED
from tests.unit.downstream.hub_world import HubWorld, Listening
from tests.unit.watch.registry_world import ALICE, BOB, DOC, OTHER
from tests.unit.watch.scripted_upstream import contents

Hubs = Callable[..., HubWorld]


async def _acked(hub: HubWorld, *listens: Listening) -> None:
    for listening in listens:
        await listening.acked()


@pytest.mark.invariant(4)
async def test_a_change_reaches_every_stream_holding_its_key_each_with_its_own_id_and_no_other_stream(
    hubs: Hubs,
) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    hub.world.upstream.resources[OTHER] = contents(OTHER, "v1")
    first, second, other = hub.listen([DOC], 7), hub.listen([DOC], "l-2"), hub.listen([OTHER], 9)
    await _acked(hub, first, second, other)
    hub.world.upstream.resources[DOC] = contents(DOC, "v2")
    await hub.world.step(5.0, looks=2)
    for listening in (first, second):
        await listening.client.until(lambda c=listening.client: c.updates() == [DOC], "the change of DOC")
    assert first.client.messages()[1] == notification(7, UPDATED, DOC)
    assert second.client.messages()[1] == notification("l-2", UPDATED, DOC)
    assert other.client.updates() == [], "written in the same pass as the others: a stream of OTHER hears nothing"
    hub.publish(hub.key(OTHER))
    await other.client.until(lambda: other.client.updates() == [OTHER], "the change of OTHER")
    assert first.client.updates() == [DOC] and second.client.updates() == [DOC]


async def test_another_replicas_first_look_tells_no_stream(hubs: Hubs) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    hub.world.upstream.resources[OTHER] = contents(OTHER, "v1")
    doc, other = hub.listen([DOC], 1), hub.listen([OTHER], 2)
    await _acked(hub, doc, other)
    hub.publish(hub.key(DOC), baseline=True)  # heard before the change below, written in the same pass if at all
    hub.publish(hub.key(OTHER))
    await other.client.until(lambda: other.client.updates() == [OTHER], "the change of OTHER")
    assert doc.client.updates() == [], "a first look is no change"


async def test_the_fan_out_writes_a_slice_of_streams_then_lets_other_work_run_then_writes_the_rest(
    hubs: Hubs,
) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    listens = [hub.listen([DOC], n) for n in range(1025)]
    await _acked(hub, *listens)
    told: list[int] = []

    def count_told() -> None:
        told.append(sum(bool(listening.client.updates()) for listening in listens))

    # Subscribed after the hub: called after its fan-out marked every stream, so this runs after the first pass.
    hub.world.bus.subscribe(lambda event: asyncio.get_running_loop().call_soon(count_told))
    hub.publish(hub.key(DOC))
    for listening in listens:
        await listening.client.until(lambda c=listening.client: c.updates() == [DOC], "every stream's change")
    assert told == [1024], "1,024 streams written, then the loop runs other work, then the rest"


async def test_a_fan_out_writes_the_streams_in_the_order_they_were_signalled(hubs: Hubs) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    hub.world.upstream.resources[OTHER] = contents(OTHER, "v1")
    listens = [hub.listen([DOC], n) for n in range(1024)]
    later = hub.listen([OTHER], "later")
    await _acked(hub, *listens, later)
    first_pass: list[tuple[int, bool]] = []

    def note_first_pass() -> None:
        told = sum(bool(listening.client.updates()) for listening in listens)
        first_pass.append((told, bool(later.client.updates())))

    hub.world.bus.subscribe(lambda event: asyncio.get_running_loop().call_soon(note_first_pass))
    hub.publish(hub.key(DOC))
    hub.publish(hub.key(OTHER))  # signalled after DOC's 1,024 streams, before the first pass runs
    await later.client.until(lambda: later.client.updates() == [OTHER], "the change of OTHER")
    assert first_pass[0] == (1024, False), "the first pass is the first 1,024 signalled; the later one waits"


@pytest.mark.invariant(11)
async def test_signals_merge_while_a_slow_client_reads_and_reach_it_as_it_reads(hubs: Hubs) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    hub.world.upstream.resources[OTHER] = contents(OTHER, "v1")
    slow = hub.listen([DOC, OTHER], 1)
    slow.client.room = 1  # the ack fills its buffer
    await slow.acked()
    doc, other = hub.key(DOC), hub.key(OTHER)
    for key in (doc, other, doc, doc):
        hub.publish(key)
    await slow.client.until(lambda: slow.client.drains == 1, "the stream waits for its client to read")
    assert slow.client.updates() == []
    slow.client.read(1)
    await slow.client.until(lambda: slow.client.drains == 2, "one more frame, then the stream waits again")
    assert slow.client.updates() == [DOC]
    slow.client.read(1)
    await slow.client.until(lambda: len(slow.client.updates()) == 2, "the other signal")
    # Room to spare, then the end: whatever is still pending is written before the complete result, so what the
    # client read by then is all it will ever be told of those four changes.
    slow.client.read(100)
    await hub.hub.close_all()
    await slow.ended()
    assert slow.client.updates() == [DOC, OTHER], "four changes of two URIs are two notifications"


@pytest.mark.invariant(10)
async def test_a_refused_credential_ends_only_that_contexts_streams_on_that_key(hubs: Hubs) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1", cacheScope="public")
    hub.world.upstream.resources[OTHER] = contents(OTHER, "v1", cacheScope="public")
    alice = hub.listen([DOC], 1, ALICE)
    bob = hub.listen([DOC, OTHER], 2, BOB)
    bob_doc = hub.listen([DOC], 4, BOB)
    bob_other = hub.listen([OTHER], 3, BOB)
    await _acked(hub, alice, bob, bob_doc, bob_other)
    hub.world.registry.hearing.refused("resources/read", {"uri": DOC}, BOB)
    await bob.ended()
    await bob_doc.ended()
    assert bob.client.messages()[-1] == complete_result(2), "ended gracefully: its client re-authenticates"
    assert bob_doc.client.messages()[-1] == complete_result(4)
    assert hub.gauge("mcp_sidecar_streams_ended_total", reason="auth") == 2
    hub.publish(WatchKey("resource", DOC, PUBLIC))
    hub.publish(WatchKey("resource", OTHER, PUBLIC))
    await alice.client.until(lambda: alice.client.updates() == [DOC], "alice still hears DOC")
    await bob_other.client.until(lambda: bob_other.client.updates() == [OTHER], "bob's other stream still hears")
    assert hub.world.watches() == {WatchKey("resource", DOC, PUBLIC): 1, WatchKey("resource", OTHER, PUBLIC): 1}


async def test_a_refused_credential_drops_that_sessions_subscription_and_lets_go_of_its_watch(hubs: Hubs) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    hub.world.upstream.resources[OTHER] = contents(OTHER, "v1")
    session = LegacySession("s-1", None, BOB, hub.world.metrics)
    for uri in (DOC, OTHER):
        handle = await hub.world.registry.acquire("resource", uri, BOB)
        assert handle is not None
        session.subscriptions[uri] = handle
        hub.hub.attach(session, handle)
    hub.publish(hub.key(DOC))
    assert len(list(session.outgoing(None, quiet=False))) == 1, "attached: the session hears its key"
    doc = hub.key(DOC)
    hub.world.registry.hearing.refused("resources/read", {"uri": DOC}, BOB)
    assert list(session.subscriptions) == [OTHER]
    assert hub.world.watches() == {doc: 0, hub.key(OTHER): 1}, "its handle released"
    hub.publish(doc)
    hub.publish(hub.key(OTHER))
    assert len(list(session.outgoing(None, quiet=False))) == 1, "only OTHER: DOC's sink is detached"
    session.subscriptions.pop(OTHER).release()


async def test_a_refusal_of_a_key_no_stream_holds_any_more_ends_no_other_stream(hubs: Hubs) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1", cacheScope="public")
    hub.world.upstream.resources[OTHER] = contents(OTHER, "v1", cacheScope="public")
    gone, stays = hub.listen([DOC], 1, BOB), hub.listen([OTHER], 2, BOB)
    await _acked(hub, gone, stays)
    gone.task.cancel()
    await asyncio.gather(gone.task, return_exceptions=True)
    hub.world.registry.hearing.refused("resources/read", {"uri": DOC}, BOB)  # DOC's watch lingers, held by no stream
    assert hub.world.refusals == [(WatchKey("resource", DOC, PUBLIC), "bob")]
    hub.publish(WatchKey("resource", OTHER, PUBLIC))
    await stays.client.until(lambda: stays.client.updates() == [OTHER], "bob's other stream still hears")


async def test_a_stream_gone_before_its_pass_is_not_written_to(hubs: Hubs) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    gone, stays = hub.listen([DOC], 1), hub.listen([DOC], 2)
    await _acked(hub, gone, stays)
    gone.task.cancel()  # the client hangs up; its handler has not resumed yet ...
    hub.publish(hub.key(DOC))  # ... when a change marks both streams
    await asyncio.gather(gone.task, return_exceptions=True)
    await stays.client.until(lambda: stays.client.updates() == [DOC], "the stream that stayed")
    assert gone.client.updates() == []


async def test_a_fan_out_is_traced_with_its_watch_and_the_streams_told(hubs: Hubs, spans: InMemorySpanExporter) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    listens = [hub.listen([DOC], n) for n in range(3)]
    await _acked(hub, *listens)
    listens[0].task.cancel()  # a stream that ended is told nothing more
    await asyncio.gather(listens[0].task, return_exceptions=True)
    spans.clear()
    key = hub.key(DOC)
    hub.publish(key)
    (span,) = [span for span in spans.get_finished_spans() if span.name == "notify streams"]
    assert dict(span.attributes or {}) == {
        "mcp_sidecar.watch": key.short_hash,
        "mcp_sidecar.kind": "resource",
        "mcp_sidecar.streams": 2,
    }


async def test_after_the_hub_closes_it_hears_no_change(hubs: Hubs) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    listening = hub.listen([DOC], 1)
    await listening.acked()
    key = hub.key(DOC)
    hub.publish(key)
    await listening.client.until(lambda: listening.client.updates() == [DOC], "the change before")
    await hub.hub.aclose()
    hub.publish(key)  # were it heard, it would be written before the end frame below
    await hub.hub.close_all()
    await listening.ended()
    assert listening.client.messages()[1:] == [notification(1, UPDATED, DOC), complete_result(1)]
