"""The bad input of `test_bad_input.py`, case by case: each malformed request (not JSON-RPC, a wrong envelope, a
header that disagrees with the body, over the size limit...) with the HTTP status and JSON-RPC error it must get,
and the odd but good requests that must be served."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.kit import META, PV, headers, request

__all__ = ["ACCEPTED", "BODY_LIMIT", "READ", "REJECTED", "Case", "HeaderList", "hdrs", "req"]


BODY_LIMIT = 2048
"""listen.max_body_bytes of every sidecar test_bad_input.py serves."""


HeaderList = list[tuple[str, str]]


@dataclass(frozen=True)
class Case:
    """One POST: the body (a dict is JSON-encoded) and the exact header list, plus what must come back."""

    body: bytes | dict[str, Any]
    headers: HeaderList
    status: int
    code: int
    echoed_id: str | int | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def encoded(self) -> bytes:
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()


def hdrs(method: str, name: str | None = None, *, drop: tuple[str, ...] = (), **extra: str) -> HeaderList:
    """The correct headers for `method`, minus `drop`, with `extra` replacing or adding values."""
    base = headers(method, name)
    base.update({key.replace("_", "-"): value for key, value in extra.items()})
    return [(key, value) for key, value in base.items() if key not in drop]


def req(method: str, params: dict[str, Any] | None = None, request_id: str | int = 1, **meta: Any) -> dict[str, Any]:
    """A modern request; `meta` keys replace (or, with None, remove) the `_meta` entries."""
    body = request(method, params, request_id)
    short = {
        "version": "io.modelcontextprotocol/protocolVersion",
        "capabilities": "io.modelcontextprotocol/clientCapabilities",
        "info": "io.modelcontextprotocol/clientInfo",
    }
    new_meta = dict(META)
    for key, value in meta.items():
        if value is None:
            new_meta.pop(short[key])
        else:
            new_meta[short[key]] = value
    body["params"]["_meta"] = new_meta
    return body


def _without_meta(method: str, request_id: str | int, *, params: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params:
        body["params"] = {}
    return body


def _b64(value: str) -> str:
    return "=?base64?" + base64.b64encode(value.encode()).decode() + "?="


READ = {"uri": "catalog://price"}


_CALL = {"name": "echo", "arguments": {"text": "hi"}}


_PROMPT = {"name": "pricing", "arguments": {"sku": "a1"}}


REJECTED = [
    # -- not JSON-RPC at all (§5: -32700, -32600) ---------------------------------------------------------
    pytest.param(Case(b'{"jsonrpc": "2.0", "id": 1, "method":', hdrs("tools/list"), 400, -32700), id="invalid-json"),
    pytest.param(Case(b"", hdrs("tools/list"), 400, -32700), id="empty-body"),
    pytest.param(Case(b'"tools/list"', hdrs("tools/list"), 400, -32600), id="json-string-not-object"),
    pytest.param(Case(b"42", hdrs("tools/list"), 400, -32600), id="json-number-not-object"),
    pytest.param(Case(json.dumps([request("tools/list")]).encode(), hdrs("tools/list"), 400, -32600), id="batch-array"),
    pytest.param(
        Case({**request("tools/list", request_id="v1"), "jsonrpc": "1.0"}, hdrs("tools/list"), 400, -32600, "v1"),
        id="jsonrpc-not-2.0-echoes-id",
    ),
    pytest.param(
        Case({"jsonrpc": "2.0", "id": "m1", "params": {"_meta": META}}, hdrs("tools/list"), 400, -32600, "m1"),
        id="no-method-echoes-id",
    ),
    pytest.param(
        Case({**request("tools/list"), "id": True}, hdrs("tools/list"), 400, -32600), id="boolean-id-not-echoed"
    ),
    # -- per-request _meta (§4.3: -32602, 400) -----------------------------------------------------------
    pytest.param(
        Case(_without_meta("tools/list", "no-meta"), hdrs("tools/list"), 400, -32602, "no-meta"),
        id="missing-_meta",
    ),
    pytest.param(
        Case(_without_meta("tools/list", 31, params=False), hdrs("tools/list"), 400, -32602, 31),
        id="missing-params-entirely",
    ),
    pytest.param(
        Case(req("tools/list", request_id="no-pv", version=None), hdrs("tools/list"), 400, -32602, "no-pv"),
        id="missing-_meta-protocolVersion",
    ),
    pytest.param(
        Case(req("tools/list", request_id=33, capabilities=None), hdrs("tools/list"), 400, -32602, 33),
        id="missing-_meta-clientCapabilities",
    ),
    pytest.param(
        Case(req("tools/list", request_id=34, capabilities=["x"]), hdrs("tools/list"), 400, -32602, 34),
        id="clientCapabilities-not-an-object",
    ),
    # -- MCP-Protocol-Version header (§4.5, §6.3: -32020, 400) -------------------------------------------
    pytest.param(
        Case(
            req("tools/list", request_id="no-hdr"),
            hdrs("tools/list", drop=("MCP-Protocol-Version",)),
            400,
            -32020,
            "no-hdr",
        ),
        id="missing-protocol-version-header",
    ),
    pytest.param(
        Case(
            req("tools/list", request_id=41),
            hdrs("tools/list", MCP_Protocol_Version="2025-11-25"),
            400,
            -32020,
            41,
        ),
        id="protocol-version-header-differs-from-_meta",
    ),
    pytest.param(
        Case(req("tools/list", request_id=42, version="2099-01-01"), hdrs("tools/list"), 400, -32020, 42),
        id="_meta-version-differs-from-header",
    ),
    # -- Mcp-Method (§4.5: -32020, 400) ------------------------------------------------------------------
    pytest.param(
        Case(
            req("tools/list", request_id="dup"),
            [*hdrs("tools/list"), ("Mcp-Method", "tools/list")],
            400,
            -32020,
            "dup",
        ),
        id="duplicate-mcp-method-header",
    ),
    pytest.param(
        Case(req("tools/list", request_id=51), hdrs("tools/list", drop=("Mcp-Method",)), 400, -32020, 51),
        id="missing-mcp-method-header",
    ),
    pytest.param(
        Case(req("tools/list", request_id=52), hdrs("prompts/list"), 400, -32020, 52),
        id="mcp-method-differs-from-body",
    ),
    pytest.param(
        Case(req("tools/list", request_id=53), hdrs("tools/list", Mcp_Method="Tools/List"), 400, -32020, 53),
        id="mcp-method-value-is-case-sensitive",
    ),
    # -- Mcp-Name for the three named methods (§4.5: -32020, 400) ----------------------------------------
    pytest.param(
        Case(req("tools/call", _CALL, 61), hdrs("tools/call"), 400, -32020, 61), id="tools/call-missing-mcp-name"
    ),
    pytest.param(
        Case(req("tools/call", _CALL, 62), hdrs("tools/call", "set_price"), 400, -32020, 62),
        id="tools/call-mcp-name-differs",
    ),
    pytest.param(
        Case(req("tools/call", _CALL, 63), hdrs("tools/call", "ECHO"), 400, -32020, 63),
        id="tools/call-mcp-name-is-case-sensitive",
    ),
    pytest.param(
        Case(
            req("tools/call", _CALL, 64),
            [*hdrs("tools/call", "echo"), ("Mcp-Name", "echo")],
            400,
            -32020,
            64,
        ),
        id="tools/call-duplicate-mcp-name",
    ),
    pytest.param(
        Case(req("prompts/get", _PROMPT, 65), hdrs("prompts/get"), 400, -32020, 65),
        id="prompts/get-missing-mcp-name",
    ),
    pytest.param(
        Case(req("prompts/get", _PROMPT, 66), hdrs("prompts/get", "other"), 400, -32020, 66),
        id="prompts/get-mcp-name-differs",
    ),
    pytest.param(
        Case(req("resources/read", READ, 67), hdrs("resources/read"), 400, -32020, 67),
        id="resources/read-missing-mcp-name",
    ),
    pytest.param(
        Case(req("resources/read", READ, 68), hdrs("resources/read", "catalog://items/a1"), 400, -32020, 68),
        id="resources/read-mcp-name-differs",
    ),
    pytest.param(
        Case(req("resources/read", READ, 69), hdrs("resources/read", _b64("catalog://nope")), 400, -32020, 69),
        id="resources/read-base64-mcp-name-differs",
    ),
    pytest.param(
        Case(req("resources/read", READ, 70), hdrs("resources/read", "=?base64?!!!?="), 400, -32020, 70),
        id="resources/read-malformed-base64-mcp-name",
    ),
    # -- versions (§5: -32022, 400) ----------------------------------------------------------------------
    pytest.param(
        Case(
            req("tools/list", request_id="v2099", version="2099-01-01"),
            hdrs("tools/list", MCP_Protocol_Version="2099-01-01"),
            400,
            -32022,
            "v2099",
            {"supported": ["2026-07-28"], "requested": "2099-01-01"},
        ),
        id="unsupported-version-2099-01-01",
    ),
    # -- removed methods under a modern envelope (§4.4, §6.3: -32601, 404) -------------------------------
    pytest.param(
        Case(
            req(
                "initialize",
                {"protocolVersion": PV, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
                80,
            ),
            hdrs("initialize"),
            404,
            -32601,
            80,
        ),
        id="removed-initialize",
    ),
    pytest.param(Case(req("ping", request_id=81), hdrs("ping"), 404, -32601, 81), id="removed-ping"),
    pytest.param(
        Case(req("logging/setLevel", {"level": "debug"}, 82), hdrs("logging/setLevel"), 404, -32601, 82),
        id="removed-logging/setLevel",
    ),
    pytest.param(
        Case(req("resources/subscribe", READ, 83), hdrs("resources/subscribe"), 404, -32601, 83),
        id="removed-resources/subscribe",
    ),
    pytest.param(
        Case(req("resources/unsubscribe", READ, 84), hdrs("resources/unsubscribe"), 404, -32601, 84),
        id="removed-resources/unsubscribe",
    ),
    # -- size (413) --------------------------------------------------------------------------------------
    pytest.param(
        Case(
            req("tools/call", {"name": "echo", "arguments": {"text": "x" * 4 * BODY_LIMIT}}, 91),
            hdrs("tools/call", "echo"),
            413,
            -32600,
        ),
        id="body-over-max_body_bytes",
    ),
    pytest.param(
        Case(
            json.dumps(req("tools/list", request_id=92)).encode().ljust(BODY_LIMIT + 1),
            hdrs("tools/list"),
            413,
            -32600,
        ),
        id="body-one-byte-over-max_body_bytes",
    ),
    # -- DNS rebinding (§4.5: Origin 403; Host 421) ------------------------------------------------------
    pytest.param(
        Case(req("tools/list", request_id=101), hdrs("tools/list", Origin="https://evil.example"), 403, -32600),
        id="foreign-origin",
    ),
    pytest.param(
        Case(
            req("tools/list", request_id=102), hdrs("tools/list", Origin="http://localhost.evil.example"), 403, -32600
        ),
        id="origin-that-only-starts-with-localhost",
    ),
    pytest.param(
        Case(req("tools/list", request_id=103), hdrs("tools/list", Origin="null"), 403, -32600),
        id="null-origin",
    ),
    pytest.param(
        Case(req("tools/list", request_id=104), hdrs("tools/list", Host="evil.example"), 421, -32600),
        id="non-loopback-host",
    ),
    pytest.param(
        Case(req("tools/list", request_id=105), hdrs("tools/list", Host="127.0.0.1.evil.example:8080"), 421, -32600),
        id="host-that-only-starts-with-a-loopback-address",
    ),
]


_CAFE = {"uri": "catalog://items/café"}


ACCEPTED = [
    pytest.param(
        req("tools/list", request_id="no-info", info=None),
        hdrs("tools/list"),
        '"name": "echo"',
        id="without-clientInfo",
    ),
    pytest.param(
        req("resources/read", READ, "b64"),
        hdrs("resources/read", _b64("catalog://price")),
        "price=100",
        id="base64-mcp-name-that-matches",
    ),
    pytest.param(
        req("resources/read", _CAFE, "b64-utf8"),
        hdrs("resources/read", _b64("catalog://items/café")),
        "item café costs 100",
        id="base64-mcp-name-of-a-non-ascii-uri",
    ),
    pytest.param(
        req("tools/call", _CALL, "call"), hdrs("tools/call", "echo"), '"text": "hi"', id="tools/call-with-mcp-name"
    ),
    pytest.param(
        req("prompts/get", _PROMPT, "prompt"),
        hdrs("prompts/get", "pricing"),
        "What is the price of a1?",
        id="prompts/get-with-mcp-name",
    ),
    pytest.param(
        req("tools/list", request_id="lower"),
        [(key.lower(), value) for key, value in hdrs("tools/list")],
        '"name": "echo"',
        id="header-names-in-lower-case",
    ),
    pytest.param(
        req("tools/list", request_id="origin"),
        hdrs("tools/list", Origin="http://localhost:6274"),
        '"name": "echo"',
        id="localhost-origin",
    ),
    pytest.param(
        req("tools/list", request_id="origin-ip"),
        hdrs("tools/list", Origin="http://127.0.0.1:3000"),
        '"name": "echo"',
        id="loopback-ip-origin",
    ),
    pytest.param(
        req("tools/list", request_id="host"),
        hdrs("tools/list", Host="localhost:1234"),
        '"name": "echo"',
        id="localhost-host-header",
    ),
]
