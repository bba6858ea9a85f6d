"""Frame builders and result stamping."""

from __future__ import annotations

import pytest

from sidecar import __version__
from sidecar.protocol.errors import InvalidParams
from sidecar.protocol.frames import (
    SERVER_INFO,
    ack_notification,
    complete_result,
    error_response,
    modern_request_meta,
    notification,
    result_response,
    session_notification,
    stamp_result,
)

KEY = "io.modelcontextprotocol/subscriptionId"


def test_stamping_fills_only_missing_fields_of_cacheable_results() -> None:
    stamped = stamp_result("resources/read", {"contents": [], "ttlMs": 500}, ttl_ms=0, scope="private")
    assert stamped == {"contents": [], "ttlMs": 500, "resultType": "complete", "cacheScope": "private"}


def test_non_cacheable_results_get_only_a_result_type() -> None:
    assert stamp_result("tools/call", {"content": []}, ttl_ms=0, scope="private") == {
        "content": [],
        "resultType": "complete",
    }


def test_an_input_required_result_carries_no_cache_hints() -> None:
    result = {"resultType": "input_required", "inputRequests": {}}
    assert stamp_result("resources/read", result, ttl_ms=0, scope="private") == result


def test_a_negative_ttl_is_replaced() -> None:
    assert stamp_result("tools/list", {"tools": [], "ttlMs": -5}, ttl_ms=7, scope="public")["ttlMs"] == 7


def test_notification_frames_carry_the_subscription_id_and_nothing_else() -> None:
    assert notification(7, "notifications/resources/updated", "x://1") == {
        "jsonrpc": "2.0",
        "method": "notifications/resources/updated",
        "params": {"_meta": {KEY: 7}, "uri": "x://1"},
    }
    assert notification("s", "notifications/tools/list_changed")["params"] == {"_meta": {KEY: "s"}}
    assert ack_notification(1, {})["params"]["notifications"] == {}
    assert complete_result("s")["result"] == {"resultType": "complete", "_meta": {KEY: "s"}}


def test_an_ack_names_what_it_left_out_under_our_own_meta_key_only_when_something_was() -> None:
    left = [{"uri": "x://gone", "code": -32602, "message": "Resource not found"}]
    assert ack_notification(1, {"toolsListChanged": True}, left)["params"] == {
        "_meta": {KEY: 1, "io.github.mcp-sidecar/leftOut": left},
        "notifications": {"toolsListChanged": True},
    }
    assert ack_notification(1, {}, [])["params"]["_meta"] == {KEY: 1}


def test_responses_echo_the_request_id_and_carry_the_error_or_result_whole() -> None:
    assert error_response(3, InvalidParams("bad cursor", {"cursor": "x"})) == {
        "jsonrpc": "2.0",
        "id": 3,
        "error": {"code": -32602, "message": "bad cursor", "data": {"cursor": "x"}},
    }
    assert error_response(None, InvalidParams("no id")) == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32602, "message": "no id"},
    }
    assert result_response("r", {"tools": []}) == {"jsonrpc": "2.0", "id": "r", "result": {"tools": []}}


def test_the_sidecars_own_requests_carry_the_modern_envelope_and_name_the_sidecar() -> None:
    assert SERVER_INFO == {"name": "mcp-sidecar", "version": __version__}
    assert modern_request_meta() == {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "mcp-sidecar", "version": __version__},
    }


def test_a_session_notification_carries_the_uri_at_most_and_no_subscription_id() -> None:
    assert session_notification("notifications/resources/updated", "x://1") == {
        "jsonrpc": "2.0",
        "method": "notifications/resources/updated",
        "params": {"uri": "x://1"},
    }
    assert session_notification("notifications/tools/list_changed", None) == {
        "jsonrpc": "2.0",
        "method": "notifications/tools/list_changed",
        "params": {},
    }


def test_an_ack_and_the_complete_frame_are_whole_json_rpc_messages() -> None:
    assert ack_notification("s", {"resourcesListChanged": True}) == {
        "jsonrpc": "2.0",
        "method": "notifications/subscriptions/acknowledged",
        "params": {"_meta": {KEY: "s"}, "notifications": {"resourcesListChanged": True}},
    }
    assert complete_result(9) == {
        "jsonrpc": "2.0",
        "id": 9,
        "result": {"resultType": "complete", "_meta": {KEY: 9}},
    }


@pytest.mark.parametrize(
    ("ttl", "kept"),
    [(0, True), (1500, True), (-1, False), (True, False), ("500", False), (1.5, False), (None, False)],
    ids=["zero", "positive", "negative", "bool", "string", "float", "null"],
)
def test_an_upstream_ttl_is_kept_only_when_it_is_a_whole_number_of_ms_not_below_zero(ttl: object, kept: bool) -> None:
    stamped = stamp_result("resources/read", {"contents": [], "ttlMs": ttl}, ttl_ms=250, scope="public")
    assert stamped["ttlMs"] == (ttl if kept else 250)


def test_stamping_fills_a_missing_ttl_and_keeps_a_valid_scope_but_replaces_an_unknown_one() -> None:
    assert stamp_result("tools/list", {"tools": []}, ttl_ms=250, scope="private") == {
        "tools": [],
        "resultType": "complete",
        "ttlMs": 250,
        "cacheScope": "private",
    }
    for scope in ("public", "private"):
        assert stamp_result("tools/list", {"cacheScope": scope}, ttl_ms=1, scope="other")["cacheScope"] == scope
    assert stamp_result("tools/list", {"cacheScope": "world"}, ttl_ms=1, scope="private")["cacheScope"] == "private"


def test_an_upstream_result_type_is_kept_and_the_result_given_is_not_edited() -> None:
    result = {"resultType": "complete", "tools": []}
    stamped = stamp_result("tools/list", result, ttl_ms=5, scope="public")
    assert stamped == {"resultType": "complete", "tools": [], "ttlMs": 5, "cacheScope": "public"}
    assert result == {"resultType": "complete", "tools": []}, "the upstream's own result is left as it came"
