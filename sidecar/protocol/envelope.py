"""Parse a downstream POST body, tell its era, and validate a modern envelope (protocol.md §4.3-§6.3)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from multidict import CIMultiDictProxy

from sidecar.protocol.constants import (
    HANDSHAKE_VERSIONS,
    HEADER_METHOD,
    HEADER_NAME,
    HEADER_PROTOCOL_VERSION,
    HEADER_SESSION_ID,
    LEGACY_VERSION,
    META_CLIENT_CAPABILITIES,
    META_PROTOCOL_VERSION,
    MODERN_VERSION,
    NAMED_METHODS,
    SUPPORTED_MODERN_VERSIONS,
)
from sidecar.protocol.errors import (
    HeaderMismatch,
    InvalidParams,
    InvalidRequest,
    ParseError,
    UnsupportedVersion,
)
from sidecar.protocol.types import RequestId

__all__ = [
    "ERA_REVISIONS",
    "MAX_DEPTH",
    "Era",
    "Message",
    "RequestId",
    "decode_header_value",
    "detect_era",
    "encode_header_value",
    "parse_message",
    "validate_modern",
]

Era = Literal["modern", "legacy"]
ERA_REVISIONS: dict[Era, str] = {"legacy": LEGACY_VERSION, "modern": MODERN_VERSION}
"""The protocol revision each era names: what an operator reads in /status, the logs and the metrics."""
Headers = CIMultiDictProxy[str]

MAX_DEPTH = 128
"""Nesting a request may have: JSON encoders stop near 255 levels, and no MCP request needs more than a few."""

_BASE64_PREFIX = "=?base64?"
_BASE64_SUFFIX = "?="


@dataclass(frozen=True, slots=True)
class Message:
    """One JSON-RPC request or notification as the client sent it; `raw` is forwarded untouched."""

    raw: dict[str, Any]
    method: str
    id: RequestId | None
    params: dict[str, Any]

    @property
    def is_notification(self) -> bool:
        return "id" not in self.raw

    @property
    def meta(self) -> dict[str, Any] | None:
        meta = self.params.get("_meta")
        return meta if isinstance(meta, dict) else None


def parse_message(body: bytes) -> Message:
    """Decode one JSON-RPC request or notification; raise ParseError or InvalidRequest."""
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ParseError("Parse error: the body is not valid JSON") from exc
    if not isinstance(raw, dict):
        raise InvalidRequest("Invalid Request: the body must be one JSON-RPC object (batches are not supported)")
    request_id = raw.get("id")
    valid_id = isinstance(request_id, str) or (isinstance(request_id, int) and not isinstance(request_id, bool))
    if "id" in raw and not valid_id:
        raise InvalidRequest("Invalid Request: id must be a string or an integer")
    echo_id: RequestId | None = request_id if valid_id else None
    if raw.get("jsonrpc") != "2.0":
        raise _invalid('Invalid Request: jsonrpc must be "2.0"', echo_id)
    method = raw.get("method")
    if not isinstance(method, str) or not method:
        if "result" in raw or "error" in raw:
            raise _invalid("Invalid Request: responses are not accepted here", echo_id)
        raise _invalid("Invalid Request: method must be a non-empty string", echo_id)
    params = raw.get("params", {})
    if not isinstance(params, dict):
        raise _invalid("Invalid Request: params must be an object", echo_id)
    # Counting brackets is cheap; only a body that could be that deep is walked.
    if body.count(b"{") + body.count(b"[") > MAX_DEPTH and _depth(params) > MAX_DEPTH:
        raise _invalid(f"Invalid Request: params nested deeper than {MAX_DEPTH} levels", echo_id)
    return Message(raw=raw, method=method, id=echo_id, params=params)


def _depth(value: Any) -> int:
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _invalid(message: str, request_id: RequestId | None) -> InvalidRequest:
    # Errors echo the request id whenever the body had a usable one.
    error = InvalidRequest(message)
    error.request_id = request_id
    return error


def detect_era(message: Message, headers: Headers) -> Era:
    """A modern envelope (`_meta` version or a modern header) is modern, whatever the method (§6.3)."""
    if HEADER_SESSION_ID in headers:
        return "legacy"
    header = headers.get(HEADER_PROTOCOL_VERSION)
    meta = message.meta
    has_modern_meta = meta is not None and META_PROTOCOL_VERSION in meta
    if has_modern_meta:
        return "modern"
    if header is None or header in HANDSHAKE_VERSIONS:
        return "legacy"
    return "modern"


def validate_modern(message: Message, headers: Headers) -> None:
    """Check a modern request's headers and `_meta` in the order the spec's reference server does."""
    for name in (HEADER_PROTOCOL_VERSION, HEADER_METHOD, HEADER_NAME):
        if len(headers.getall(name, [])) > 1:
            raise HeaderMismatch(f"{name} header appears more than once")
    header_version = headers.get(HEADER_PROTOCOL_VERSION)
    if header_version is None:
        raise HeaderMismatch(f"missing {HEADER_PROTOCOL_VERSION} header")
    meta = message.meta
    if (
        meta is None
        or not isinstance(meta.get(META_PROTOCOL_VERSION), str)
        or not isinstance(meta.get(META_CLIENT_CAPABILITIES), dict)
    ):
        raise InvalidParams(
            f"params._meta must be an object carrying {META_PROTOCOL_VERSION} (string) "
            f"and {META_CLIENT_CAPABILITIES} (object)"
        )
    meta_version = meta[META_PROTOCOL_VERSION]
    if header_version != meta_version:
        raise HeaderMismatch(
            f"{HEADER_PROTOCOL_VERSION} header {header_version!r} does not match _meta protocolVersion {meta_version!r}"
        )
    if meta_version not in SUPPORTED_MODERN_VERSIONS:
        raise UnsupportedVersion(
            "Unsupported protocol version",
            {"supported": list(SUPPORTED_MODERN_VERSIONS), "requested": meta_version},
        )
    header_method = headers.get(HEADER_METHOD)
    if header_method is None:
        raise HeaderMismatch(f"missing {HEADER_METHOD} header")
    if header_method != message.method:
        raise HeaderMismatch(f"{HEADER_METHOD} header does not match the request body's method")
    param = NAMED_METHODS.get(message.method)
    if param is None:
        return
    header_name = headers.get(HEADER_NAME)
    if header_name is None:
        raise HeaderMismatch(f"missing {HEADER_NAME} header, required for {message.method}")
    body_value = message.params.get(param)
    if not isinstance(body_value, str) or decode_header_value(header_name) != body_value:
        raise HeaderMismatch(f"{HEADER_NAME} header does not match params.{param}")


def decode_header_value(value: str) -> str | None:
    """Undo the `=?base64?...?=` form of `Mcp-Name`/`Mcp-Param-*`; None when it is malformed."""
    if not (value.startswith(_BASE64_PREFIX) and value.endswith(_BASE64_SUFFIX)):
        return value
    encoded = value[len(_BASE64_PREFIX) : -len(_BASE64_SUFFIX)]
    try:
        return base64.b64decode(encoded, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def encode_header_value(value: str) -> str:
    """Plain printable ASCII goes as is; anything else as `=?base64?...?=` (SEP-2243)."""
    if value.isascii() and value.isprintable() and not value.startswith("=?base64?") and value == value.strip():
        return value
    return "=?base64?" + base64.b64encode(value.encode("utf-8")).decode("ascii") + "?="
