"""The upstream's own notifications as hints (`sidecar.watch.native`): one stream per context up to the limit,
kept while any stream of the context holds a key, a public key covered by any context's stream, nothing held
when the feature is off or the upstream unknown, the credential leaving memory with the context's last hold,
and shutdown closing every stream. A scripted upstream that can push, a clock moved by hand, and waits on what
the fakes report (`tests/unit/watch/native/native_harness.py`).
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from sidecar.config import PollingConfig
from sidecar.identity import ANONYMOUS_IDENTITY, PUBLIC, Identity
from sidecar.protocol.errors import UpstreamHTTPError
from sidecar.watch.native_stream import NativeStream
from tests.unit.watch.native.native_harness import (
    ALICE,
    BOB,
    DEBOUNCE_S,
    DOC,
    OTHER,
    Bench,
    ended,
    make_bench,
    stream_tasks,
)
from tests.unit.watch.scripted_upstream import URL


async def test_each_context_has_its_own_stream_up_to_the_limit(legacy: Bench) -> None:
    carol = Identity("carol", (("authorization", "Bearer c"),), client="carol-laptop")
    alices = legacy.watch("resource", DOC, ALICE)
    bobs = legacy.watch("resource", DOC, BOB)
    over = legacy.watch("resource", DOC, carol)
    assert legacy.gauge("mcp_sidecar_limit_rejections_total", limit="native_streams") == 1
    await legacy.until(lambda: alices.native and bobs.native)
    assert [opened.identity.context for opened in legacy.upstream.opened] == ["alice", "bob"]
    assert not over.native, "over max_native_streams: polled only"
    legacy.native.drop("carol", "resource", DOC)  # what was never held is not dropped
    legacy.native.drop("bob", "resource", DOC)
    again = legacy.watch("resource", OTHER, carol)
    await legacy.until(lambda: again.native and len(legacy.upstream.open) == 2)
    assert [opened.identity.context for opened in legacy.upstream.open] == ["alice", "carol"]


async def test_a_stream_lasts_while_any_stream_of_its_context_holds_a_key(legacy: Bench) -> None:
    doc = legacy.watch("resource", DOC, ALICE)
    legacy.watch("resource", DOC, ALICE)  # a second client stream of the same context, same URI
    tools = legacy.watch("tools_list", None, ALICE)
    legacy.watch("tools_list", None, ALICE)
    await legacy.until(lambda: doc.native and tools.native)
    legacy.native.drop("alice", "resource", DOC)
    legacy.native.drop("alice", "tools_list", None)
    other = legacy.watch("resource", OTHER, ALICE)  # a change the stream does act on, after the two drops
    await legacy.timer_at(DEBOUNCE_S)
    legacy.clock.advance(DEBOUNCE_S)
    await legacy.until(lambda: other.native)
    assert legacy.covered() == {doc.key, tools.key, other.key}, "each still held by the other client stream"
    assert legacy.upstream.calls == [("resources/subscribe", uri, "alice") for uri in (DOC, OTHER)]
    legacy.native.drop("alice", "resource", DOC)
    legacy.native.drop("alice", "resource", OTHER)
    await legacy.timer_at(2 * DEBOUNCE_S)
    legacy.clock.advance(DEBOUNCE_S)
    await legacy.until(lambda: not doc.native and not other.native)
    assert [call[0] for call in legacy.upstream.calls[2:]] == ["resources/unsubscribe"] * 2
    assert legacy.upstream.open and tools.native, "the tool list still held"
    legacy.native.drop("alice", "resource", OTHER)  # no longer held
    legacy.native.drop("bob", "tools_list", None)  # no stream
    legacy.native.drop("alice", "tools_list", None)
    await legacy.until(lambda: legacy.upstream.open == [] and legacy.gauge("mcp_sidecar_native_streams") == 0)
    legacy.watch("resource", DOC, ALICE)
    await legacy.until(lambda: len(legacy.upstream.open) == 1)  # a context back later gets a new stream


async def test_a_public_key_is_covered_by_any_contexts_stream(legacy: Bench) -> None:
    public = legacy.watch("resource", DOC, ALICE, public=True)
    await legacy.until(lambda: public.native)
    assert legacy.native.covers("resource", DOC, PUBLIC)
    assert not legacy.native.covers("resource", OTHER, PUBLIC)
    assert not legacy.native.covers("resource", DOC, "bob"), "a private key only by its own context's stream"
    anonymous = legacy.watch("tools_list", None, ANONYMOUS_IDENTITY, public=True)
    await legacy.until(lambda: anonymous.native)
    assert legacy.native.covers("tools_list", None, PUBLIC)


async def test_nothing_is_held_when_native_notifications_are_off() -> None:
    bench = make_bench("legacy", config=PollingConfig(native_notifications=False))
    doc = bench.watch("resource", DOC, ALICE)
    assert stream_tasks() == set(), "no stream is started"
    assert bench.upstream.opened == [] and not doc.native
    await bench.native.aclose()


async def test_nothing_is_held_before_the_upstream_is_known() -> None:
    bench = make_bench("legacy")
    bench.upstream.info = None
    doc = bench.watch("resource", DOC, ALICE)
    assert stream_tasks() == set(), "no stream is started"
    assert bench.upstream.opened == [] and not doc.native
    await bench.native.aclose()


async def test_shutdown_closes_every_stream() -> None:
    bench = make_bench("modern")
    bench.watch("resource", DOC, ALICE)
    bench.watch("resource", DOC, BOB)
    await bench.until(lambda: len(bench.upstream.open) == 2)
    await bench.native.aclose()
    assert bench.upstream.open == []
    assert bench.gauge("mcp_sidecar_native_streams") == 0
    assert stream_tasks() == set()
    bench.native.drop("alice", "resource", DOC)  # a release after shutdown is harmless


def _streams_in_memory(bench: Bench) -> int:
    """The bench's notification streams still in memory, each keeping its context's credential."""
    gc.collect()
    return sum(isinstance(thing, NativeStream) and thing.owner is bench.native for thing in gc.get_objects())


async def test_no_credential_stays_in_memory_after_a_contexts_last_drop(legacy: Bench) -> None:
    legacy.watch("resource", DOC, ALICE)
    legacy.watch("tools_list", None, BOB)
    await legacy.until(lambda: len(legacy.upstream.open) == 2)
    assert _streams_in_memory(legacy) == 2
    legacy.native.drop("alice", "resource", DOC)
    await ended(_ending())
    assert _streams_in_memory(legacy) == 1
    legacy.native.drop("bob", "tools_list", None)
    await ended(_ending())
    assert _streams_in_memory(legacy) == 0


def _ending() -> set[asyncio.Task[Any]]:
    """The streams' tasks told to end (kept nowhere else: a finished task's error would keep its stream)."""
    return {task for task in stream_tasks() if task.cancelling()}


async def test_no_credential_stays_in_memory_once_the_upstream_refused_its_stream(legacy: Bench) -> None:
    legacy.upstream.refusals = [UpstreamHTTPError(URL, 405, "Method Not Allowed")] * 2
    legacy.watch("resource", DOC, ALICE)
    legacy.watch("resource", DOC, BOB)
    await legacy.until(lambda: legacy.native.unsupported)
    await ended(stream_tasks())
    assert _streams_in_memory(legacy) == 0


async def test_shutdown_waits_for_a_dropped_stream_still_closing() -> None:
    bench = make_bench("modern")
    doc = bench.watch("resource", DOC, ALICE)
    await bench.until(lambda: doc.native)
    bench.upstream.closing_gate = asyncio.Event()
    bench.native.drop("alice", "resource", DOC)
    await bench.until(lambda: bench.upstream.held_closing == 1)  # its task is closing the stream, slowly
    await bench.native.aclose()
    assert stream_tasks() == set(), "no stream's task outlives shutdown"
    assert bench.upstream.open == []
    bench.upstream.closing_gate.set()


async def test_shutdown_while_the_old_listen_closes_closes_the_new_one_too() -> None:
    bench = make_bench("modern")
    doc = bench.watch("resource", DOC, ALICE)
    await bench.until(lambda: doc.native)
    bench.upstream.closing_gate = asyncio.Event()
    bench.watch("resource", OTHER, ALICE)
    await bench.timer_at(DEBOUNCE_S)
    bench.clock.advance(DEBOUNCE_S)
    await bench.until(lambda: len(bench.upstream.opened) == 2 and bench.upstream.held_closing == 1)
    assert bench.upstream.opened[1].all_taken(), "the new listen is acknowledged; the old one is closing"
    closing = asyncio.create_task(bench.native.aclose())
    await bench.until(bench.upstream.opened[0].closed.is_set)  # shutdown cut the old one's slow close short
    bench.upstream.closing_gate.set()
    await closing
    assert bench.upstream.open == [], "neither listen (nor its credential) is left open"
