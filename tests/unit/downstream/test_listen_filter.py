"""What a listen asks for and what its ack says of each part left out, with no socket: every refusal of a
malformed filter in the words the client reads, the error each left-out part names (invariant 2), and the one
log line that counts them by reason without naming an identified context's URIs."""

from __future__ import annotations

import logging

import pytest

from sidecar.downstream.listen_filter import Ack, LeftOut, SubscriptionFilter, log_left_out, parse_filter
from sidecar.identity import ANONYMOUS_IDENTITY, Identity
from sidecar.observability.naming import context_label, shown_uri
from sidecar.protocol.errors import (
    InvalidParams,
    MethodNotFound,
    RpcError,
    TooManyRequests,
    UpstreamHTTPError,
    UpstreamUnavailable,
)

URL = "http://upstream.test/mcp"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "params.notifications must be an object (a SubscriptionFilter)"),
        ({"notifications": []}, "params.notifications must be an object (a SubscriptionFilter)"),
        ({"notifications": {"toolsListChanged": "yes"}}, "notifications.toolsListChanged must be a boolean"),
        (
            {"notifications": {"resourceSubscriptions": "x://a"}},
            "notifications.resourceSubscriptions must be an array of URIs",
        ),
        (
            {"notifications": {"resourceSubscriptions": [5]}},
            "notifications.resourceSubscriptions must contain only URIs",
        ),
        (
            {"notifications": {"resourceSubscriptions": ["no-scheme"]}},
            "notifications.resourceSubscriptions must contain only URIs",
        ),
        (
            {"notifications": {"resourceSubscriptions": ["x:" + "a" * 15]}},
            "a subscribed URI is longer than 16 characters",
        ),
    ],
    ids=[
        "no filter",
        "not an object",
        "flag not boolean",
        "uris not a list",
        "uri not a string",
        "no scheme",
        "too long",
    ],
)
def test_a_malformed_filter_is_invalid_params_in_words_that_say_what_is_wrong(
    params: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidParams) as raised:
        parse_filter(params, 16)
    assert str(raised.value) == message


def test_a_uri_of_exactly_the_limit_and_every_list_flag_are_accepted() -> None:
    wanted = parse_filter(
        {
            "notifications": {
                "resourceSubscriptions": ["x:" + "a" * 14],
                "toolsListChanged": True,
                "promptsListChanged": True,
                "resourcesListChanged": True,
            }
        },
        16,
    )
    assert wanted == SubscriptionFilter(("tools_list", "prompts_list", "resources_list"), ("x:" + "a" * 14,))


@pytest.mark.parametrize(
    ("error", "reason", "code", "message"),
    [
        (
            UpstreamHTTPError(URL, 401, "Unauthorized"),
            "upstream_refused",
            -32600,
            "the upstream refused the request (HTTP 401)",
        ),
        (UpstreamUnavailable(URL, "connection refused"), "upstream_error", -32603, "the upstream is unavailable"),
        (TooManyRequests("over your share"), "rate_limited", -32603, "over your share"),
        (MethodNotFound("no such thing"), "refused", -32601, "no such thing"),
    ],
    ids=["auth", "upstream down", "rate limited", "other"],
)
@pytest.mark.invariant(2)
def test_a_part_whose_first_read_failed_names_the_error_that_read_would_have_got(
    error: Exception, reason: str, code: int, message: str
) -> None:
    left = LeftOut.refused(error, "x://a")  # type: ignore[arg-type]
    assert left == LeftOut(reason, code, message, "x://a")  # an upstream failure's message names no address
    assert left.as_meta() == {"uri": "x://a", "code": code, "message": message}
    listed = LeftOut.refused(error, None, "toolsListChanged")  # type: ignore[arg-type]
    assert listed.as_meta() == {"notification": "toolsListChanged", "code": code, "message": message}


def test_every_kind_of_left_out_part_says_its_code_and_message() -> None:
    assert LeftOut.not_found("x://a").as_meta() == {"uri": "x://a", "code": -32602, "message": "Resource not found"}
    assert LeftOut.not_found(None, "toolsListChanged") == LeftOut(
        "not_found", -32602, "Resource not found", None, "toolsListChanged"
    )
    assert LeftOut.internal(None, "promptsListChanged") == LeftOut(
        "internal", -32603, "Internal error", None, "promptsListChanged"
    )
    assert LeftOut.internal("x://a").as_meta() == {"uri": "x://a", "code": -32603, "message": "Internal error"}
    assert LeftOut.over_limit("x://c", 2) == LeftOut(
        "max_uris_per_stream",
        -32602,
        "a listen may subscribe to at most 2 URIs (streams.max_uris_per_stream)",
        "x://c",
    )
    assert LeftOut.unsupported("promptsListChanged", "prompts") == LeftOut(
        "unsupported", -32601, "the upstream has no prompts", notification="promptsListChanged"
    )
    refused = RpcError("not yours", code=-32003)
    assert LeftOut.answered("upstream_refused", refused, "x://a") == LeftOut(
        "upstream_refused", -32003, "not yours", "x://a"
    )


def test_the_ack_names_uris_past_the_limit_with_the_limit() -> None:
    ack = Ack(SubscriptionFilter((), ("x://1", "x://2", "x://3")), {"resources"}, 2)
    ack.settle([None, None])
    assert ack.meta() == [
        {
            "uri": "x://3",
            "code": -32602,
            "message": "a listen may subscribe to at most 2 URIs (streams.max_uris_per_stream)",
        }
    ]


def test_an_outcome_for_every_part_asked_or_the_ack_is_not_settled() -> None:
    ack = Ack(SubscriptionFilter((), ("x://1", "x://2")), {"resources"}, 10)
    with pytest.raises(ValueError):
        ack.settle([None])


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == "sidecar.downstream.listen_filter"]


def test_the_log_counts_left_out_uris_by_reason_and_names_at_most_ten_hashed_for_an_identified_context(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.downstream.listen_filter")
    identity = Identity("ctx-alice")
    left = [LeftOut.not_found(f"x://{n}") for n in range(12)] + [LeftOut.internal("x://broken")]
    left.append(LeftOut.unsupported("promptsListChanged", "prompts"))
    log_left_out("listen left URIs out of its ack", left, identity, subscription_id=7)
    (record,) = _records(caplog)
    assert record.getMessage() == "listen left URIs out of its ack"
    assert record.levelno == logging.INFO
    assert record.subscription_id == 7  # type: ignore[attr-defined]
    assert record.context == context_label("ctx-alice")  # type: ignore[attr-defined]
    assert record.left_out == {"not_found": 12, "internal": 1}  # type: ignore[attr-defined]
    assert record.uris == {  # type: ignore[attr-defined]
        "not_found": [shown_uri("resource", f"x://{n}", "ctx-alice") for n in range(10)],
        "internal": [shown_uri("resource", "x://broken", "ctx-alice")],
    }
    assert all(uri is not None and uri.startswith("private:") for uri in record.uris["not_found"])  # type: ignore[attr-defined]


def test_the_log_names_an_anonymous_clients_uris_and_says_nothing_when_only_lists_were_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.downstream.listen_filter")
    log_left_out("m", [LeftOut.unsupported("promptsListChanged", "prompts")], ANONYMOUS_IDENTITY)
    assert _records(caplog) == []
    log_left_out(
        "m", [LeftOut.unsupported("promptsListChanged", "prompts"), LeftOut.not_found("x://a")], ANONYMOUS_IDENTITY
    )
    (record,) = _records(caplog)
    assert record.uris == {"not_found": ["x://a"]}  # type: ignore[attr-defined]
