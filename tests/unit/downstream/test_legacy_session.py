"""A 2025-11-25 session's GET stream rules with no socket: what it writes after each wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import orjson

from sidecar.changes import WatchKey
from sidecar.downstream.event_stream import COMMENT, message_event
from sidecar.downstream.legacy_session import LegacySession
from sidecar.identity import ANONYMOUS_IDENTITY, Identity
from sidecar.observability.metrics import Metrics
from sidecar.protocol.frames import session_notification
from sidecar.watch.handles import Handle
from tests.kit import TOOLS_CHANGED, UPDATED, WAIT_S


def _session() -> tuple[LegacySession, Metrics]:
    metrics = Metrics()
    return LegacySession("s-1", None, ANONYMOUS_IDENTITY, metrics), metrics


def _sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_the_upstreams_frame_goes_first_then_each_pending_signal_once() -> None:
    session, metrics = _session()
    for _ in range(3):
        session.signal(UPDATED, "x://a", 0.0)
    session.signal(TOOLS_CHANGED, None, 0.0)
    frames = list(session.outgoing(b"event: message\r\ndata: {}\r\n\r\n", quiet=False))
    assert frames == [
        b"event: message\r\ndata: {}\r\n\r\n",
        message_event(orjson.dumps(session_notification(UPDATED, "x://a"))),
        message_event(orjson.dumps(session_notification(TOOLS_CHANGED, None))),
    ]
    assert list(session.outgoing(None, quiet=False)) == [], "the set was emptied"
    assert _sample(metrics, "mcp_sidecar_notifications_total", method=UPDATED) == 1


def test_a_signal_while_the_stream_writes_waits_for_the_next_round() -> None:
    session, _ = _session()
    session.signal(UPDATED, "x://a", 0.0)
    writing = session.outgoing(None, quiet=False)
    next(writing)
    session.signal(UPDATED, "x://b", 0.0)
    assert list(writing) == []
    assert list(session.outgoing(None, quiet=False)) == [
        message_event(orjson.dumps(session_notification(UPDATED, "x://b")))
    ]


def test_a_whole_quiet_interval_gets_a_comment_and_a_busy_one_none() -> None:
    session, metrics = _session()
    assert list(session.outgoing(None, quiet=True)) == [COMMENT]
    session.signal(UPDATED, "x://a", 0.0)
    assert COMMENT not in list(session.outgoing(None, quiet=False))
    assert _sample(metrics, "mcp_sidecar_keepalives_total") == 1


def test_a_notification_is_counted_only_once_it_was_written() -> None:
    session, metrics = _session()
    session.signal(UPDATED, "x://a", 0.0)
    writing = session.outgoing(None, quiet=False)
    next(writing)  # the write of it fails (the client went away): the stream asks for nothing more
    assert _sample(metrics, "mcp_sidecar_notifications_total", method=UPDATED) == 0


def _handle(kind: str, uri: str | None, context: str = "anonymous") -> Handle:
    return Handle(WatchKey(kind, uri, context), context, lambda handle: None)  # type: ignore[arg-type]


def test_a_new_session_is_unused_unended_and_holds_nothing() -> None:
    metrics = Metrics()
    identity = Identity("ctx-a")
    before = time.monotonic()
    session = LegacySession("s-9", "up-3", identity, metrics)
    assert before <= session.last_seen <= time.monotonic(), "an unused session's idle time counts from now"
    assert (session.session_id, session.upstream_session, session.identity) == ("s-9", "up-3", identity)
    assert session.used is False and session.ended is False and session.lists_watched is False
    assert session.get_streams == 0
    assert session.subscriptions == {} and session.list_handles == [] and session.handles == []
    assert session.opened_at == session.last_seen


def test_a_refused_credential_ends_that_subscription_or_list_only() -> None:
    session, _ = _session()
    a, b = _handle("resource", "x://a"), _handle("resource", "x://b")
    tools, prompts = _handle("tools_list", None), _handle("prompts_list", None)
    session.subscriptions = {"x://a": a, "x://b": b}
    session.list_handles = [tools, prompts]
    assert session.handles == [a, b, tools, prompts]
    assert session.revoke(a.key) == [a]
    assert session.subscriptions == {"x://b": b}
    assert session.revoke(WatchKey("resource", "x://gone", "anonymous")) == []
    assert session.revoke(tools.key) == [tools]
    assert session.list_handles == [prompts] and session.subscriptions == {"x://b": b}


class _Events:
    """A GET stream's connection: records what is sent, and lets the test wait for a number of frames."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.changed = asyncio.Event()

    async def send(self, frame: bytes) -> None:
        self.frames.append(frame)
        self.changed.set()

    async def wait_for(self, count: int) -> None:
        await self.until(lambda: len(self.frames) >= count)

    async def until(self, predicate: Callable[[], bool]) -> None:
        try:
            async with asyncio.timeout(WAIT_S):
                while not predicate():
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            raise AssertionError(f"not within {WAIT_S} s; sent {self.frames}") from None


async def test_a_get_stream_writes_the_upstreams_frames_and_our_signals_until_the_session_ends() -> None:
    session, metrics = _session()
    events, upstream = _Events(), asyncio.Queue[bytes]()
    serving = asyncio.ensure_future(session.serve_get(events, upstream, keepalive_s=3_600))  # type: ignore[arg-type]
    session.signal(UPDATED, "x://a", 0.0)
    await events.wait_for(1)
    upstream.put_nowait(b"event: message\r\ndata: {}\r\n\r\n")
    await events.wait_for(2)
    assert events.frames == [
        message_event(orjson.dumps(session_notification(UPDATED, "x://a"))),
        b"event: message\r\ndata: {}\r\n\r\n",
    ]
    session.close("deleted")
    await serving
    assert session.ended and upstream.empty()
    assert _sample(metrics, "mcp_sidecar_keepalives_total") == 0, "never a whole quiet interval"


class _Upstream(asyncio.Queue[bytes]):
    """The upstream session's frames, telling the test each time the GET stream asks for the next one."""

    def __init__(self) -> None:
        super().__init__()
        self.asks = 0
        self.asked = asyncio.Event()

    async def get(self) -> bytes:
        self.asks += 1
        self.asked.set()
        return await super().get()  # waiting in the queue as of this step

    async def until_asked(self, times: int) -> None:
        async with asyncio.timeout(WAIT_S):
            while self.asks < times:
                self.asked.clear()
                await self.asked.wait()


FRAME = b"event: message\r\ndata: {}\r\n\r\n"


async def test_an_upstream_frame_after_a_round_our_signal_ended_is_written() -> None:
    # A round that ends without an upstream frame leaves its wait on the upstream's queue pending: not cancelled,
    # it would take the next frame, which nobody then writes (the client never sees that upstream message).
    session, _ = _session()
    events, upstream = _Events(), _Upstream()
    serving = asyncio.ensure_future(session.serve_get(events, upstream, keepalive_s=3_600))  # type: ignore[arg-type]
    await upstream.until_asked(1)
    session.signal(UPDATED, "x://a", 0.0)
    await upstream.until_asked(2)  # the next round waits, the first round's wait gone
    upstream.put_nowait(FRAME)
    await events.until(lambda: FRAME in events.frames)
    session.close("deleted")
    await serving


async def test_an_upstream_frame_after_a_quiet_interval_is_written() -> None:
    session, _ = _session()
    events, upstream = _Events(), _Upstream()
    serving = asyncio.ensure_future(session.serve_get(events, upstream, keepalive_s=0.001))  # type: ignore[arg-type]
    await upstream.until_asked(2)  # a quiet interval ended the first round, with both of its waits pending
    upstream.put_nowait(FRAME)
    await events.until(lambda: FRAME in events.frames)
    session.close("deleted")
    await serving


async def test_a_get_stream_on_an_ended_session_ends_at_once() -> None:
    session, _ = _session()
    session.close("deleted")
    events = _Events()
    await session.serve_get(events, asyncio.Queue(), keepalive_s=3_600)  # type: ignore[arg-type]
    assert events.frames == []


async def test_a_get_stream_quiet_for_a_whole_interval_hears_a_comment() -> None:
    session, metrics = _session()
    events = _Events()
    serving = asyncio.ensure_future(session.serve_get(events, asyncio.Queue(), keepalive_s=0.01))  # type: ignore[arg-type]
    await events.wait_for(1)
    session.close("deleted")
    await serving
    assert set(events.frames) == {COMMENT}
    assert _sample(metrics, "mcp_sidecar_keepalives_total") == len(events.frames)
