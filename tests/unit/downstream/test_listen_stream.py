"""A listen stream's pending signals are a set: bounded by its subscriptions, whatever the change rate."""

from __future__ import annotations

import orjson
import pytest

from sidecar.downstream.legacy_session import LegacySession
from sidecar.downstream.listen import ListenStream, _frame_around_id, parse_filter
from sidecar.identity import ANONYMOUS_IDENTITY
from sidecar.observability.metrics import Metrics
from sidecar.protocol.errors import InvalidParams
from sidecar.protocol.frames import notification


@pytest.mark.invariant(11)
def test_ten_thousand_changes_leave_one_pending_signal_per_subscription() -> None:
    metrics = Metrics()
    woken: list[ListenStream] = []
    stream = ListenStream("l-1", metrics, on_pending=woken.append, on_written=lambda method, at: None)
    for i in range(10_000):
        stream.signal("notifications/resources/updated", f"x://{i % 3}", 0.0)
        stream.signal("notifications/tools/list_changed", None, 0.0)
    assert stream.pending_count == 4
    assert metrics.coalesced._value.get() == 20_000 - 4
    assert woken == [stream], "the fan-out is asked to visit the stream once, when its first signal pends"


@pytest.mark.invariant(11)
def test_a_2025_session_keeps_the_same_set_and_counts_its_merges_as_a_listen_stream_does() -> None:
    metrics = Metrics()
    session = LegacySession("s-1", None, ANONYMOUS_IDENTITY, metrics)
    session.signal("notifications/resources/updated", "x://a", 1.0)
    for _ in range(999):
        session.signal("notifications/resources/updated", "x://a", 2.0)
    session.signal("notifications/tools/list_changed", None, 3.0)
    assert dict(session._pending) == {
        ("notifications/resources/updated", "x://a"): 1.0,
        ("notifications/tools/list_changed", None): 3.0,
    }
    assert metrics.coalesced._value.get() == 999


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
        (7, "notifications/resources/updated", "x://a"),
        ("l-1", "notifications/resources/updated", 'x://"quoted"\x00and a NUL'),
        ("l-2", "notifications/tools/list_changed", None),
    ],
    ids=["number id", "string id, odd URI", "list change"],
)
def test_a_frame_built_around_the_id_is_the_notification_byte_for_byte(
    subscription_id: int | str, method: str, uri: str | None
) -> None:
    before, after = _frame_around_id(method, uri)
    assert before + orjson.dumps(subscription_id) + after == orjson.dumps(notification(subscription_id, method, uri))
