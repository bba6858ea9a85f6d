"""Frame builders and result stamping."""

from __future__ import annotations

from sidecar.protocol.frames import ack_notification, complete_result, notification, stamp_result

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
