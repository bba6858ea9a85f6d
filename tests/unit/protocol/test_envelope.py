"""Era detection follows the envelope, never the method name (protocol.md §6.3)."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from sidecar.protocol.envelope import decode_header_value, detect_era, parse_message

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


def _headers(**values: str) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict({k.replace("_", "-"): v for k, v in values.items()}))


@pytest.mark.parametrize(
    ("params", "headers", "era"),
    [
        ({"_meta": META}, {}, "modern"),
        ({}, {"MCP_Protocol_Version": "2026-07-28"}, "modern"),
        ({}, {}, "legacy"),
        ({}, {"MCP_Protocol_Version": "2025-11-25"}, "legacy"),
        ({"_meta": META}, {"Mcp_Session_Id": "abc"}, "legacy"),
    ],
    ids=["modern-meta", "modern-header", "bare", "legacy-header", "session"],
)
def test_era_comes_from_the_envelope(params: dict[str, object], headers: dict[str, str], era: str) -> None:
    message = parse_message(b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":%s}' % _json(params))
    assert detect_era(message, _headers(**headers)) == era


def _json(value: object) -> bytes:
    import orjson

    return orjson.dumps(value)


def test_base64_header_values_decode_and_bad_ones_do_not_match() -> None:
    assert decode_header_value("=?base64?w6k=?=") == "é"
    assert decode_header_value("plain") == "plain"
    assert decode_header_value("=?base64?***?=") is None
