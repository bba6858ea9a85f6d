"""The rules that bridge the two eras whichever leg the upstream is on (HTTP or stdio): what a 2025-11-25 server
must not be sent, how its answers read to a 2026-07-28 client (stamped results, mapped errors: protocol.md
section 5), the `_meta` a 2026-07-28 server needs, and what counts as an answer at all."""

from __future__ import annotations

from sidecar.config import CacheConfig
from sidecar.protocol import (
    META_CLIENT_CAPABILITIES,
    META_CLIENT_INFO,
    META_LOG_LEVEL,
    META_PROTOCOL_VERSION,
    JsonObject,
    RequestId,
    UpstreamBadResponse,
    UpstreamRpcError,
    modern_request_meta,
    stamp_result,
)

__all__ = [
    "checked",
    "map_legacy_error",
    "own_request_params",
    "reply_to_server_request",
    "response",
    "result_of",
    "strip_modern_meta",
    "translated",
    "with_modern_meta",
]


_MODERN_META_KEYS = (META_PROTOCOL_VERSION, META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_LOG_LEVEL)
_NOT_FOUND_CODES = (-32002, 0)  # -32002: 2025-11-25 and most SDKs; 0: Python SDK 1.x (SEP-2164 table)
_NOT_FOUND_WORDS = ("not found", "unknown resource", "no such resource", "does not exist")
_RESERVED_RANGE = range(-32099, -32019)  # spec-reserved; only codes it defines may reach a modern client
_DEFINED_MODERN_CODES = (-32020, -32021, -32022)
_REFUSED = {"code": -32601, "message": "not available through mcp-sidecar"}


def strip_modern_meta(params: JsonObject) -> JsonObject:
    """Params without the modern envelope keys a legacy server does not know (progressToken etc. stay)."""
    meta = params.get("_meta")
    if not isinstance(meta, dict):
        return params
    kept = {key: value for key, value in meta.items() if key not in _MODERN_META_KEYS}
    stripped = {key: value for key, value in params.items() if key != "_meta"}
    if kept:
        stripped["_meta"] = kept
    return stripped


def map_legacy_error(method: str, params: JsonObject, error: JsonObject) -> JsonObject:
    """Turn a legacy error into what a 2026-07-28 client expects (protocol.md §5)."""
    code = error.get("code")
    message = str(error.get("message", ""))
    if method == "resources/read" and (
        code in _NOT_FOUND_CODES or any(word in message.lower() for word in _NOT_FOUND_WORDS)
    ):
        return {"code": -32602, "message": message or "Resource not found", "data": {"uri": params.get("uri")}}
    if isinstance(code, int) and code in _RESERVED_RANGE and code not in _DEFINED_MODERN_CODES:
        return {"code": -32603, "message": message, "data": {"upstreamCode": code}}
    return error


def translated(upstream: str, cache: CacheConfig, method: str, params: JsonObject, answer: JsonObject) -> JsonObject:
    """A 2025-11-25 server's answer as a 2026-07-28 client needs it: its result stamped (`resultType`, `ttlMs`,
    `cacheScope`), or its error mapped."""
    answer = checked(upstream, answer)
    if "error" in answer:
        return {"error": map_legacy_error(method, params, answer["error"])}
    ttl_ms, scope = cache.default_ttl_ms, cache.default_scope
    return {"result": stamp_result(method, answer["result"], ttl_ms=ttl_ms, scope=scope)}


def checked(upstream: str, answer: JsonObject) -> JsonObject:
    """The answer's `result` or `error`, or UpstreamBadResponse when it has neither (of the right shape)."""
    if isinstance(answer.get("error"), dict):
        return {"error": answer["error"]}
    if isinstance(answer.get("result"), dict):
        return {"result": answer["result"]}
    raise UpstreamBadResponse(upstream, "response has neither result nor error")


def result_of(upstream: str, answer: JsonObject) -> JsonObject:
    """A checked answer's result, or its error raised as an UpstreamRpcError (the sidecar's own requests)."""
    if "error" in answer:
        raise UpstreamRpcError(upstream, answer["error"])
    result: JsonObject = answer["result"]
    return result


def response(request_id: RequestId | None, answer: JsonObject) -> JsonObject:
    """A JSON-RPC response to `request_id` carrying `answer`'s result or error."""
    return {"jsonrpc": "2.0", "id": request_id, **answer}


def own_request_params(params: JsonObject) -> JsonObject:
    """The params of a 2026-07-28 request the sidecar makes on its own behalf: the `_meta` the era requires."""
    return {**params, "_meta": modern_request_meta()}


def with_modern_meta(params: JsonObject) -> JsonObject:
    """A 2025-11-25 client's params with the `_meta` a 2026-07-28 server requires (its own keys, progressToken
    and the like, kept)."""
    meta = params.get("_meta")
    return {**params, "_meta": {**modern_request_meta(), **(meta if isinstance(meta, dict) else {})}}


def reply_to_server_request(request: JsonObject) -> JsonObject:
    """The sidecar's reply to a request the upstream sends its client (sampling, elicitation, roots): no client of
    ours can answer for all, so it is refused at once and the upstream does not wait forever; a ping is answered."""
    if request.get("method") == "ping":
        return {"jsonrpc": "2.0", "id": request["id"], "result": {}}
    return {"jsonrpc": "2.0", "id": request["id"], "error": dict(_REFUSED)}
