"""The upstream's own notifications as hints (`sidecar.watch.native`): one stream per context up to the limit,
kept while any stream of the context holds a key, a public key covered by any context's stream, nothing held
when the feature is off or the upstream unknown, the credential leaving memory with the context's last hold,
and shutdown closing every stream. The rules as playbooks (`native_book.py`); the streams' tasks and what they
keep in memory on a scripted upstream that can push, with a clock moved by hand (`native_harness.py`).
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from sidecar.config import PollingConfig
from sidecar.identity import ANONYMOUS, ANONYMOUS_IDENTITY, PUBLIC, Identity
from sidecar.protocol.errors import UpstreamHTTPError
from sidecar.watch.native_events import (
    Began,
    Debounce,
    Debounced,
    Dropped,
    Finish,
    Held,
    LimitHit,
    OpenSession,
    Probe,
    Probed,
    SessionOpened,
    Start,
    Stop,
    Stopped,
    StreamsOpen,
    Subscribe,
    SubscribeAnswered,
    Unsubscribe,
    Unsubscribed,
    Wait,
    Wake,
    Woken,
)
from sidecar.watch.native_stream import NativeStream
from tests.unit.watch.native.native_book import book, cover, hint, rules, subscribed
from tests.unit.watch.native.native_harness import (
    ALICE,
    BOB,
    DEBOUNCE_S,
    DOC,
    EVERYTHING,
    OTHER,
    Bench,
    ended,
    make_bench,
    stream_tasks,
)
from tests.unit.watch.scripted_upstream import URL

CAROL = Identity("carol", (("authorization", "Bearer c"),), client="carol-laptop")


def test_each_context_has_its_own_stream_up_to_the_limit() -> None:
    play = book()  # two streams at most
    subscribed(play, 1, ALICE, DOC)
    subscribed(play, 2, BOB, DOC)
    play.step(Held(CAROL, "resource", DOC, EVERYTHING), LimitHit())  # over max_native_streams: polled only
    play.step(Dropped("carol", "resource", DOC))  # what was never held is not dropped
    play.step(Dropped("bob", "resource", DOC), Stop(2))
    subscribed(play, 3, CAROL, OTHER)  # bob's stream out of the table at once, still closing
    play.step(
        Stopped(2),
        StreamsOpen(-1),
        *cover("resource", DOC, "bob", own=False, public=True),  # alice's stream still covers the public key
    )


def test_a_stream_lasts_while_any_stream_of_its_context_holds_a_key() -> None:
    play = book()
    play.step(Held(ALICE, "resource", DOC, EVERYTHING), Start(1, ALICE))
    play.step(Held(ALICE, "resource", DOC, EVERYTHING), Wake(1))  # a second client stream of the context, same URI
    play.step(Held(ALICE, "tools_list", None, EVERYTHING), Wake(1))
    play.step(Held(ALICE, "tools_list", None, EVERYTHING), Wake(1))
    play.step(Began(1), Probe(1))
    play.step(Probed(1, False, EVERYTHING), OpenSession(1))
    play.step(SessionOpened(1), StreamsOpen(1), Subscribe(1, DOC))
    play.step(
        SubscribeAnswered(1, DOC, ok=True),
        *cover("resource", DOC, "alice", own=True, public=True),
        *cover("tools_list", None, "alice", own=True, public=True),
        *hint("resource", DOC, "alice", warm=False),
        *hint("tools_list", None, "alice", warm=False),
        Wait(1),
    )
    play.step(Dropped("alice", "resource", DOC))  # each still held by the other client stream
    play.step(Dropped("alice", "tools_list", None))
    play.step(Held(ALICE, "resource", OTHER, EVERYTHING), Wake(1))  # a change the stream does act on
    play.step(Woken(1), Debounce(1, DEBOUNCE_S))
    play.at(DEBOUNCE_S).step(Debounced(1, EVERYTHING), Subscribe(1, OTHER))
    play.step(
        SubscribeAnswered(1, OTHER, ok=True),
        *cover("resource", OTHER, "alice", own=True, public=True),
        *hint("resource", OTHER, "alice", warm=False),
        Wait(1),
    )
    play.step(Dropped("alice", "resource", DOC), Wake(1))
    play.step(Dropped("alice", "resource", OTHER), Wake(1))
    play.step(Woken(1), Debounce(1, DEBOUNCE_S))
    play.at(2 * DEBOUNCE_S).step(Debounced(1, EVERYTHING), Unsubscribe(1, DOC))
    play.step(Unsubscribed(1, DOC), Unsubscribe(1, OTHER))
    play.step(  # the tool list still held: the stream goes on
        Unsubscribed(1, OTHER),
        *cover("resource", DOC, "alice", own=False, public=False),
        *cover("resource", OTHER, "alice", own=False, public=False),
        Wait(1),
    )
    play.step(Dropped("alice", "resource", OTHER))  # no longer held
    play.step(Dropped("bob", "tools_list", None))  # no stream
    play.step(Dropped("alice", "tools_list", None), Stop(1))
    play.step(Stopped(1), StreamsOpen(-1), *cover("tools_list", None, "alice", own=False, public=False))
    play.step(Held(ALICE, "resource", DOC, EVERYTHING), Start(2, ALICE))  # a context back later gets a new stream


def test_a_stream_let_go_of_while_it_probes_finishes_on_the_answer_asking_nothing_more() -> None:
    # The context's last hold went while the probe was in flight: its answer finishes the stream, with nothing
    # listened for, subscribed to or retried.
    play = book()
    play.step(Held(ALICE, "tools_list", None, EVERYTHING), Start(1, ALICE))
    play.step(Began(1), Probe(1))
    play.step(Dropped("alice", "tools_list", None), Stop(1))
    play.step(Probed(1, True, EVERYTHING), Finish(1))


def test_a_public_key_is_covered_by_any_contexts_stream() -> None:
    play = book()
    subscribed(play, 1, ALICE, DOC)
    assert rules(play).covers("resource", DOC, PUBLIC)
    assert not rules(play).covers("resource", OTHER, PUBLIC)
    assert not rules(play).covers("resource", DOC, "bob"), "a private key only by its own context's stream"
    play.step(Held(ANONYMOUS_IDENTITY, "tools_list", None, EVERYTHING), Start(2, ANONYMOUS_IDENTITY))
    play.step(Began(2), Probe(2))
    play.step(Probed(2, False, EVERYTHING), OpenSession(2))
    play.step(
        SessionOpened(2),
        StreamsOpen(1),
        *cover("tools_list", None, ANONYMOUS, own=True, public=True),
        *hint("tools_list", None, ANONYMOUS, warm=False),
        Wait(2),
    )
    assert rules(play).covers("tools_list", None, PUBLIC)


def test_nothing_is_held_when_native_notifications_are_off() -> None:
    play = book(PollingConfig(native_notifications=False))
    play.step(Held(ALICE, "resource", DOC, EVERYTHING))  # no stream is started
    assert not rules(play).covers("resource", DOC, "alice")


def test_nothing_is_held_before_the_upstream_is_known() -> None:
    play = book()
    play.step(Held(ALICE, "resource", DOC, {}))  # no stream is started
    assert not rules(play).covers("resource", DOC, "alice")


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
