"""A listen's ack composed with no I/O: what it joins, what it leaves out and why (invariant 2), and when a
listen is answered with an error instead of an ack that honours nothing."""

from __future__ import annotations

import pytest

from sidecar.downstream.listen_filter import Ack, Asked, LeftOut, SubscriptionFilter
from sidecar.protocol.errors import UpstreamHTTPError, UpstreamUnavailable

URL = "http://upstream.test/mcp"
ALL = {"resources", "tools", "prompts"}


def _filter(*uris: str, lists: tuple[str, ...] = ()) -> SubscriptionFilter:
    return SubscriptionFilter(lists, uris)  # type: ignore[arg-type]


def test_the_lists_come_first_then_the_uris_in_the_order_asked() -> None:
    ack = Ack(_filter("x://b", "x://a", lists=("prompts_list", "tools_list")), ALL, 10)
    assert ack.asked == [
        Asked("tools_list", "toolsListChanged", None),
        Asked("prompts_list", "promptsListChanged", None),
        Asked("resource", None, "x://b"),
        Asked("resource", None, "x://a"),
    ]
    assert ack.left_out == [] and ack.over_limit == []


@pytest.mark.invariant(2)
def test_a_list_kind_the_upstream_lacks_is_not_joined_and_is_left_out_with_its_reason() -> None:
    ack = Ack(_filter("x://a", lists=("tools_list", "prompts_list")), {"resources", "tools"}, 10)
    assert [part.kind for part in ack.asked] == ["tools_list", "resource"]
    ack.settle([None, None])
    assert ack.honoured == {"toolsListChanged": True, "resourceSubscriptions": ["x://a"]}
    assert ack.meta() == [
        {"notification": "promptsListChanged", "code": -32601, "message": "the upstream has no prompts"}
    ]


@pytest.mark.invariant(2)
def test_what_could_not_be_joined_is_left_out_of_the_ack_and_named_with_its_error() -> None:
    ack = Ack(_filter("x://found", "x://missing", "x://broken", lists=("tools_list",)), ALL, 10)
    ack.settle([None, None, LeftOut.not_found("x://missing"), LeftOut.internal("x://broken")])
    assert ack.honoured == {"toolsListChanged": True, "resourceSubscriptions": ["x://found"]}
    assert [(left.reason, left.uri) for left in ack.left_out] == [
        ("not_found", "x://missing"),
        ("internal", "x://broken"),
    ]
    assert ack.asked == [], "what was asked is not kept for the stream's life"


@pytest.mark.invariant(2)
def test_uris_past_the_limit_are_not_joined_and_are_left_out_after_the_rest() -> None:
    ack = Ack(_filter("x://1", "x://2", "x://3", "x://4"), ALL, 2)
    assert [part.uri for part in ack.asked] == ["x://1", "x://2"]
    assert [left.uri for left in ack.over_limit] == ["x://3", "x://4"]
    ack.settle([LeftOut.not_found("x://1"), None])
    assert ack.honoured == {"resourceSubscriptions": ["x://2"]}
    assert [(left.reason, left.uri) for left in ack.left_out] == [
        ("not_found", "x://1"),
        ("max_uris_per_stream", "x://3"),
        ("max_uris_per_stream", "x://4"),
    ]


def test_nothing_honoured_for_want_of_an_answer_is_an_error_a_refused_credential_first() -> None:
    down = UpstreamUnavailable(URL, "connection refused")
    refused = UpstreamHTTPError(URL, 401, "Unauthorized")
    ack = Ack(_filter("x://a", "x://b"), ALL, 10)
    ack.settle([LeftOut.refused(down, "x://a"), LeftOut.refused(refused, "x://b")])
    assert ack.refusal([down, refused]) is refused
    assert ack.refusal([down]) is down


def test_an_ack_that_honours_something_or_failed_for_no_upstream_error_is_sent() -> None:
    down = UpstreamUnavailable(URL, "connection refused")
    some = Ack(_filter("x://a", "x://b"), ALL, 10)
    some.settle([LeftOut.refused(down, "x://a"), None])
    assert some.refusal([down]) is None
    missing = Ack(_filter("x://a"), ALL, 10)
    missing.settle([LeftOut.not_found("x://a")])
    assert missing.refusal([]) is None, "nothing exists: an empty ack says so"
