"""Pure builders for the JSON-RPC messages the sidecar writes; no I/O, tested without a server."""

from __future__ import annotations

from sidecar import __version__
from sidecar.protocol.constants import (
    ACK_METHOD,
    CACHEABLE_METHODS,
    META_CLIENT_CAPABILITIES,
    META_CLIENT_INFO,
    META_ENDED,
    META_LEFT_OUT,
    META_PROTOCOL_VERSION,
    META_SUBSCRIPTION_ID,
    MODERN_VERSION,
)
from sidecar.protocol.errors import RpcError
from sidecar.protocol.types import JsonObject, RequestId

__all__ = [
    "SERVER_INFO",
    "ack_notification",
    "complete_result",
    "error_response",
    "modern_request_meta",
    "notification",
    "result_response",
    "session_notification",
    "stamp_result",
]

SERVER_INFO: JsonObject = {"name": "mcp-sidecar", "version": __version__}
"""The identity the sidecar puts in `_meta` serverInfo of results it answers itself."""


def error_response(request_id: RequestId | None, error: RpcError) -> JsonObject:
    """A JSON-RPC error response echoing the request id (null when the body had none)."""
    return {"jsonrpc": "2.0", "id": request_id, "error": error.to_error()}


def result_response(request_id: RequestId | None, result: JsonObject) -> JsonObject:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def modern_request_meta() -> JsonObject:
    """The `_meta` envelope of requests the sidecar makes on its own (polls, discover)."""
    return {
        META_PROTOCOL_VERSION: MODERN_VERSION,
        META_CLIENT_CAPABILITIES: {},
        META_CLIENT_INFO: SERVER_INFO,
    }


def notification(subscription_id: RequestId, method: str, uri: str | None = None) -> JsonObject:
    """A change notification on a listen stream: a signal (the URI at most), never content."""
    params: JsonObject = {"_meta": {META_SUBSCRIPTION_ID: subscription_id}}
    if uri is not None:
        params["uri"] = uri
    return {"jsonrpc": "2.0", "method": method, "params": params}


def session_notification(method: str, uri: str | None) -> JsonObject:
    """A change notification on a 2025-11-25 session's GET stream: the URI at most, no subscription id."""
    return {"jsonrpc": "2.0", "method": method, "params": {"uri": uri} if uri is not None else {}}


def ack_notification(
    subscription_id: RequestId, honoured: JsonObject, left_out: list[JsonObject] | None = None
) -> JsonObject:
    """The first frame of every listen stream: the subset of the filter the sidecar will honour, and (in our own
    `_meta` key) why the rest of it was left out."""
    meta: JsonObject = {META_SUBSCRIPTION_ID: subscription_id}
    if left_out:
        meta[META_LEFT_OUT] = left_out
    return {"jsonrpc": "2.0", "method": ACK_METHOD, "params": {"_meta": meta, "notifications": honoured}}


def complete_result(subscription_id: RequestId, ended: JsonObject | None = None) -> JsonObject:
    """The only result a listen request ever gets: the graceful end of the stream; `ended` says why, when the
    client should act on it (`META_ENDED`)."""
    meta: JsonObject = {META_SUBSCRIPTION_ID: subscription_id}
    if ended is not None:
        meta[META_ENDED] = ended
    return result_response(subscription_id, {"resultType": "complete", "_meta": meta})


def stamp_result(method: str, result: JsonObject, *, ttl_ms: int, scope: str) -> JsonObject:
    """Add the fields a 2026-07-28 client requires to a result from a legacy upstream.

    Fields the upstream did set are kept; only missing ones are filled.
    """
    stamped = dict(result)
    stamped.setdefault("resultType", "complete")
    if method in CACHEABLE_METHODS and stamped["resultType"] == "complete":
        ttl = stamped.get("ttlMs")
        if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0:
            stamped["ttlMs"] = ttl_ms
        if stamped.get("cacheScope") not in ("public", "private"):
            stamped["cacheScope"] = scope
    return stamped
