"""A listen stream's own rules, with no socket: a recording writer stands for the connection's send buffer.

Its pending signals are a set (bounded by its subscriptions, whatever the change rate), written while the buffer
has room; a quiet stream hears a comment every keep-alive interval; a closed one flushes, then ends with the
complete result. The driver's part (waiting) is what `step` returns.
"""

from __future__ import annotations

import typing

import orjson
import pytest

from sidecar.changes import WatchKey
from sidecar.downstream.legacy_session import LegacySession
from sidecar.downstream.listen_filter import parse_filter
from sidecar.downstream.listen_stream import ListenStream, Step, frame_around_id
from sidecar.downstream.pending import PendingSignals
from sidecar.identity import ANONYMOUS_IDENTITY
from sidecar.observability.metrics import Metrics
from sidecar.protocol.errors import InvalidParams
from sidecar.protocol.frames import complete_result, notification
from tests.kit import TOOLS_CHANGED, UPDATED


class RecordingWriter:
    """The send buffer of a connection: room for `room` frames until the client reads (`read`)."""

    def __init__(self, room: int = 1_000) -> None:
        self.room = room
        self.connected = True
        self.quiet = True
        self.frames: list[bytes] = []
        """What the client has been sent, events as their JSON and comments as `b":"`."""

    @property
    def writable(self) -> bool:
        return self.connected and self.room > 0

    def write_event(self, data: bytes) -> None:
        self._write(data)

    def write_comment(self) -> None:
        self._write(b":")

    def _write(self, frame: bytes) -> None:
        self.quiet = False
        self.room -= 1
        self.frames.append(frame)

    def read(self, frames: int) -> None:
        self.room += frames

    def events(self) -> list[object]:
        return [orjson.loads(frame) for frame in self.frames if frame != b":"]


def _stream(subscription_id: int | str = "l-1", metrics: Metrics | None = None) -> tuple[ListenStream, list[str]]:
    written: list[str] = []
    stream = ListenStream(
        subscription_id, metrics or Metrics(), on_pending=lambda s: None, on_written=lambda m, at: written.append(m)
    )
    return stream, written


@pytest.mark.invariant(11)
def test_ten_thousand_changes_leave_one_pending_signal_per_subscription() -> None:
    metrics = Metrics()
    woken: list[ListenStream] = []
    stream = ListenStream("l-1", metrics, on_pending=woken.append, on_written=lambda method, at: None)
    for i in range(10_000):
        stream.signal(UPDATED, f"x://{i % 3}", 0.0)
        stream.signal(TOOLS_CHANGED, None, 0.0)
    assert stream.pending_count == 4
    assert metrics.coalesced._value.get() == 20_000 - 4
    assert woken == [stream], "the fan-out is asked to visit the stream once, when its first signal pends"


@pytest.mark.invariant(11)
def test_a_slow_client_gets_each_key_once_however_often_it_changed_while_its_buffer_was_full() -> None:
    stream, _ = _stream()
    writer = RecordingWriter(room=0)
    stream.begin(writer)
    for _ in range(1_000):
        stream.signal(UPDATED, "x://a", 0.0)
        stream.signal(UPDATED, "x://b", 0.0)
    assert stream.step() is Step.DRAIN, "the buffer is full: the driver waits for the client"
    writer.read(10)
    assert stream.step() is Step.WAIT
    assert [event["params"]["uri"] for event in writer.events()] == ["x://a", "x://b"]  # type: ignore[index]


@pytest.mark.invariant(11)
def test_a_2025_session_keeps_the_same_set_and_counts_its_merges_as_a_listen_stream_does() -> None:
    metrics = Metrics()
    session = LegacySession("s-1", None, ANONYMOUS_IDENTITY, metrics)
    session.signal(UPDATED, "x://a", 1.0)
    for _ in range(999):
        session.signal(UPDATED, "x://a", 2.0)
    session.signal(TOOLS_CHANGED, None, 3.0)
    assert dict(session._pending) == {(UPDATED, "x://a"): 1.0, (TOOLS_CHANGED, None): 3.0}
    assert metrics.coalesced._value.get() == 999


def test_signals_before_the_ack_wait_for_it() -> None:
    stream, written = _stream()
    stream.signal(UPDATED, "x://a", 0.0)
    stream.flush()  # the fan-out's visit before the ack is written: nothing may go out yet
    writer = RecordingWriter()
    stream.begin(writer)
    assert writer.frames == [] and stream.pending_count == 1
    assert stream.step() is Step.WAIT
    assert len(writer.frames) == 1 and written == [UPDATED]


def test_the_fan_out_writes_what_fits_and_wakes_the_driver_for_the_rest() -> None:
    stream, written = _stream()
    writer = RecordingWriter(room=2)
    stream.begin(writer)
    waiter = _Waiter()
    stream.waiter = waiter  # type: ignore[assignment]
    for n in range(5):
        stream.signal(UPDATED, f"x://{n}", 0.0)
    stream.flush()
    assert len(writer.frames) == 2 and stream.pending_count == 3
    assert waiter.woken, "what did not fit is the driver's: it is woken to wait for the client"
    assert written == [UPDATED, UPDATED]
    writer.read(3)
    assert stream.step() is Step.WAIT and stream.pending_count == 0


class _Waiter:
    def __init__(self) -> None:
        self.woken = False

    def done(self) -> bool:
        return self.woken

    def set_result(self, _: None) -> None:
        self.woken = True


@pytest.mark.invariant(3)
@pytest.mark.parametrize("subscription_id", [7, "l-7"], ids=["number", "string"])
def test_every_signal_carries_the_listen_id_with_its_type(subscription_id: int | str) -> None:
    stream, _ = _stream(subscription_id)
    writer = RecordingWriter()
    stream.begin(writer)
    stream.signal(UPDATED, "x://a", 0.0)
    stream.signal(TOOLS_CHANGED, None, 0.0)
    stream.flush()
    assert writer.events() == [
        notification(subscription_id, UPDATED, "x://a"),
        notification(subscription_id, TOOLS_CHANGED),
    ]


@pytest.mark.invariant(13)
def test_a_closed_stream_flushes_what_is_pending_then_ends_with_the_complete_result() -> None:
    stream, _ = _stream(7)
    writer = RecordingWriter(room=0)
    stream.begin(writer)
    stream.signal(UPDATED, "x://a", 0.0)
    stream.close("shutdown")
    assert stream.step() is Step.DRAIN, "the pending signal first"
    writer.read(2)
    assert stream.step() is Step.DONE
    assert writer.events() == [notification(7, UPDATED, "x://a"), complete_result(7)]
    assert stream.end_reason == "shutdown"


@pytest.mark.invariant(13)
def test_an_idle_stream_closed_while_its_driver_waits_is_woken_and_ends_with_the_complete_result() -> None:
    stream, _ = _stream("l-2")
    writer = RecordingWriter()
    stream.begin(writer)
    assert stream.step() is Step.WAIT
    waiter = _Waiter()
    stream.waiter = waiter  # type: ignore[assignment]
    stream.close("max_age")
    assert waiter.woken
    assert stream.step() is Step.DONE
    assert writer.events() == [complete_result("l-2")]


def test_a_client_gone_ends_the_stream_with_nothing_written() -> None:
    stream, _ = _stream()
    writer = RecordingWriter()
    stream.begin(writer)
    stream.signal(UPDATED, "x://a", 0.0)
    writer.connected = False
    stream.close("shutdown")
    assert stream.step() is Step.DONE
    assert writer.frames == []


@pytest.mark.invariant(12)
def test_a_quiet_stream_hears_a_comment_every_keepalive_interval_and_a_busy_one_none() -> None:
    stream, _ = _stream()
    writer = RecordingWriter()
    assert not stream.keepalive(), "nothing before the ack"
    stream.begin(writer)
    assert [stream.keepalive() for _ in range(5)] == [True] * 5, "one comment at every tick of a quiet stream"
    assert writer.frames == [b":"] * 5
    writer.frames.clear()
    for n in range(3):
        stream.signal(UPDATED, f"x://{n}", 0.0)
        stream.flush()
        assert not stream.keepalive(), "written since the last tick: no comment"
    assert stream.keepalive(), "quiet again for a whole interval"
    assert writer.frames[-1] == b":" and len(writer.frames) == 4


def test_a_stream_whose_buffer_is_full_gets_no_comment_on_top() -> None:
    stream, _ = _stream()
    writer = RecordingWriter(room=0)
    stream.begin(writer)
    assert not stream.keepalive()
    assert writer.frames == []


def test_a_finished_stream_writes_nothing_more() -> None:
    stream, _ = _stream()
    writer = RecordingWriter()
    stream.begin(writer)
    stream.finish()
    stream.signal(UPDATED, "x://a", 0.0)
    stream.flush()
    assert not stream.keepalive()
    assert writer.frames == []


def test_filter_keeps_uris_in_order_without_duplicates() -> None:
    wanted = parse_filter({"notifications": {"resourceSubscriptions": ["b:1", "a:1", "b:1"]}}, 100)
    assert wanted.uris == ("b:1", "a:1")
    assert wanted.lists == ()


def test_filter_false_flags_subscribe_to_nothing() -> None:
    wanted = parse_filter({"notifications": {"toolsListChanged": False, "promptsListChanged": True}}, 100)
    assert wanted.lists == ("prompts_list",)


def test_a_uri_longer_than_the_limit_is_invalid_params() -> None:
    with pytest.raises(InvalidParams, match="longer than 16"):
        parse_filter({"notifications": {"resourceSubscriptions": ["x:" + "a" * 20]}}, 16)


@pytest.mark.parametrize(
    ("subscription_id", "method", "uri"),
    [
        (7, UPDATED, "x://a"),
        ("l-1", UPDATED, 'x://"quoted"\x00and a NUL'),
        ("l-2", TOOLS_CHANGED, None),
    ],
    ids=["number id", "string id, odd URI", "list change"],
)
def test_a_frame_built_around_the_id_is_the_notification_byte_for_byte(
    subscription_id: int | str, method: str, uri: str | None
) -> None:
    before, after = frame_around_id(method, uri)
    assert before + orjson.dumps(subscription_id) + after == orjson.dumps(notification(subscription_id, method, uri))


def test_a_new_stream_has_ended_for_no_reason_yet_holds_nothing_and_its_first_signal_wakes_the_fan_out() -> None:
    woken: list[ListenStream] = []
    stream = ListenStream("l-1", Metrics(), on_pending=woken.append, on_written=lambda method, at: None)
    assert stream.end_reason == "client", "a stream that ends unasked ended because its client left"
    assert stream.ended is False and stream.handles == [] and stream.pending_count == 0
    stream.signal(UPDATED, "x://a", 0.0)
    assert woken == [stream]


def test_delivery_latency_counts_from_the_first_change_the_client_had_not_heard_of() -> None:
    written: list[tuple[str, float]] = []
    stream = ListenStream("l-1", Metrics(), on_pending=lambda s: None, on_written=lambda m, at: written.append((m, at)))
    writer = RecordingWriter(room=0)
    stream.begin(writer)
    stream.signal(UPDATED, "x://a", 1.5)
    stream.signal(UPDATED, "x://a", 2.5)
    writer.read(1)
    stream.flush()
    assert written == [(UPDATED, 1.5)]


@pytest.mark.invariant(13)
def test_a_refused_credential_ends_the_whole_stream_with_the_complete_result() -> None:
    stream, _ = _stream(3)
    writer = RecordingWriter()
    stream.begin(writer)
    assert stream.revoke(WatchKey("resource", "x://a", "ctx")) == [], "its handles are released as it ends"
    assert stream.end_reason == "auth"
    assert stream.step() is Step.DONE
    assert writer.events() == [complete_result(3)]


def test_the_pending_set_counts_merges_on_any_counter_its_protocol_describes() -> None:
    metrics = Metrics()
    counter_type = typing.get_type_hints(PendingSignals.__init__)["coalesced"]
    assert counter_type.inc(metrics.coalesced) is None, "a protocol's stub: it describes, never counts"
    pending = PendingSignals(metrics.coalesced)
    assert pending.add(UPDATED, "x://a", 1.0) and not pending.add(UPDATED, "x://a", 2.0)
    assert metrics.coalesced._value.get() == 1 and dict(pending) == {(UPDATED, "x://a"): 1.0}
