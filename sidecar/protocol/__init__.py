"""JSON-RPC envelopes, errors, era detection and the few message shapes the sidecar touches."""

from __future__ import annotations

from sidecar.protocol.envelope import Era, Message, detect_era, parse_message, validate_modern
from sidecar.protocol.errors import RpcError, SidecarError, UpstreamError
from sidecar.protocol.types import JsonObject, RequestId

__all__ = [
    "Era",
    "JsonObject",
    "Message",
    "RequestId",
    "RpcError",
    "SidecarError",
    "UpstreamError",
    "detect_era",
    "parse_message",
    "validate_modern",
]
