"""A 2025-11-25 session's GET stream rules with no socket: what it writes after each wait."""

from __future__ import annotations

import orjson

from sidecar.downstream.event_stream import COMMENT, message_event
from sidecar.downstream.legacy_session import LegacySession
from sidecar.identity import ANONYMOUS_IDENTITY
from sidecar.observability.metrics import Metrics
from sidecar.protocol.frames import session_notification

UPDATED = "notifications/resources/updated"
TOOLS = "notifications/tools/list_changed"


def _session() -> tuple[LegacySession, Metrics]:
    metrics = Metrics()
    return LegacySession("s-1", None, ANONYMOUS_IDENTITY, metrics), metrics


def _sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_the_upstreams_frame_goes_first_then_each_pending_signal_once() -> None:
    session, metrics = _session()
    for _ in range(3):
        session.signal(UPDATED, "x://a", 0.0)
    session.signal(TOOLS, None, 0.0)
    frames = list(session.outgoing(b"event: message\r\ndata: {}\r\n\r\n", quiet=False))
    assert frames == [
        b"event: message\r\ndata: {}\r\n\r\n",
        message_event(orjson.dumps(session_notification(UPDATED, "x://a"))),
        message_event(orjson.dumps(session_notification(TOOLS, None))),
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
