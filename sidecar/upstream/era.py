"""The rules that bridge the two eras whichever leg the upstream is on (HTTP or stdio): what a 2025-11-25 server
must not be sent, and how its errors read to a 2026-07-28 client (protocol.md section 5)."""

from __future__ import annotations

from typing import Any

from sidecar.protocol.constants import META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_LOG_LEVEL, META_PROTOCOL_VERSION

__all__ = ["map_legacy_error", "strip_modern_meta"]

JsonObject = dict[str, Any]

_MODERN_META_KEYS = (META_PROTOCOL_VERSION, META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_LOG_LEVEL)
_NOT_FOUND_CODES = (-32002, 0)  # -32002: 2025-11-25 and most SDKs; 0: Python SDK 1.x (SEP-2164 table)
_NOT_FOUND_WORDS = ("not found", "unknown resource", "no such resource", "does not exist")
_RESERVED_RANGE = range(-32099, -32019)  # spec-reserved; only codes it defines may reach a modern client
_DEFINED_MODERN_CODES = (-32020, -32021, -32022)


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
