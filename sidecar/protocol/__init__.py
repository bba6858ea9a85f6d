"""JSON-RPC envelopes, errors, era detection and the few message shapes the sidecar touches."""

from __future__ import annotations

from sidecar.protocol.envelope import Era, Message, RequestId, detect_era, parse_message, validate_modern
from sidecar.protocol.errors import RpcError, SidecarError, UpstreamError

__all__ = [
    "Era",
    "Message",
    "RequestId",
    "RpcError",
    "SidecarError",
    "UpstreamError",
    "detect_era",
    "parse_message",
    "validate_modern",
]
