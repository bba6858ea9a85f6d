"""Bad input gets the error protocol.md §4.3, §4.5 and §5 prescribe, and never takes the sidecar down.

Every case is one raw POST (aiohttp, so the headers are exactly what the case says) to a sidecar in
front of a real modern upstream. The upstream subprocess is shared by the whole module (it takes a
second and a half to start); each test gets its own sidecar.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.kit import META, PV, Sidecar, headers, request, rpc, serve_sidecar
from tests.peers import Upstream, start_upstream

pytestmark = pytest.mark.asyncio(loop_scope="module")

BODY_LIMIT = 2048
"""listen.max_body_bytes of every sidecar in this module."""

HeaderList = list[tuple[str, str]]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def modern_upstream() -> AsyncIterator[Upstream]:
    """One SDK 2.3 modern upstream for the whole module (overrides the per-test conftest fixture)."""
    async with await start_upstream("modern") as up:
        yield up


@pytest_asyncio.fixture(loop_scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session on the module's event loop (the conftest one lives on a per-test loop)."""
    async with aiohttp.ClientSession() as session:
        yield session


@pytest_asyncio.fixture(loop_scope="module")
async def sidecar(modern_upstream: Upstream) -> AsyncIterator[Sidecar]:
    async with serve_sidecar(modern_upstream.url, listen={"max_body_bytes": BODY_LIMIT}) as served:
        yield served


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


def _hdrs(method: str, name: str | None = None, *, drop: tuple[str, ...] = (), **extra: str) -> HeaderList:
    """The correct headers for `method`, minus `drop`, with `extra` replacing or adding values."""
    base = headers(method, name)
    base.update({key.replace("_", "-"): value for key, value in extra.items()})
    return [(key, value) for key, value in base.items() if key not in drop]


def _req(method: str, params: dict[str, Any] | None = None, request_id: str | int = 1, **meta: Any) -> dict[str, Any]:
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


_READ = {"uri": "catalog://price"}
_CALL = {"name": "echo", "arguments": {"text": "hi"}}
_PROMPT = {"name": "pricing", "arguments": {"sku": "a1"}}

REJECTED = [
    # -- not JSON-RPC at all (§5: -32700, -32600) ---------------------------------------------------------
    pytest.param(Case(b'{"jsonrpc": "2.0", "id": 1, "method":', _hdrs("tools/list"), 400, -32700), id="invalid-json"),
    pytest.param(Case(b"", _hdrs("tools/list"), 400, -32700), id="empty-body"),
    pytest.param(Case(b'"tools/list"', _hdrs("tools/list"), 400, -32600), id="json-string-not-object"),
    pytest.param(Case(b"42", _hdrs("tools/list"), 400, -32600), id="json-number-not-object"),
    pytest.param(
        Case(json.dumps([request("tools/list")]).encode(), _hdrs("tools/list"), 400, -32600), id="batch-array"
    ),
    pytest.param(
        Case({**request("tools/list", request_id="v1"), "jsonrpc": "1.0"}, _hdrs("tools/list"), 400, -32600, "v1"),
        id="jsonrpc-not-2.0-echoes-id",
    ),
    pytest.param(
        Case({"jsonrpc": "2.0", "id": "m1", "params": {"_meta": META}}, _hdrs("tools/list"), 400, -32600, "m1"),
        id="no-method-echoes-id",
    ),
    pytest.param(
        Case({**request("tools/list"), "id": True}, _hdrs("tools/list"), 400, -32600), id="boolean-id-not-echoed"
    ),
    # -- per-request _meta (§4.3: -32602, 400) -----------------------------------------------------------
    pytest.param(
        Case(_without_meta("tools/list", "no-meta"), _hdrs("tools/list"), 400, -32602, "no-meta"),
        id="missing-_meta",
    ),
    pytest.param(
        Case(_without_meta("tools/list", 31, params=False), _hdrs("tools/list"), 400, -32602, 31),
        id="missing-params-entirely",
    ),
    pytest.param(
        Case(_req("tools/list", request_id="no-pv", version=None), _hdrs("tools/list"), 400, -32602, "no-pv"),
        id="missing-_meta-protocolVersion",
    ),
    pytest.param(
        Case(_req("tools/list", request_id=33, capabilities=None), _hdrs("tools/list"), 400, -32602, 33),
        id="missing-_meta-clientCapabilities",
    ),
    pytest.param(
        Case(_req("tools/list", request_id=34, capabilities=["x"]), _hdrs("tools/list"), 400, -32602, 34),
        id="clientCapabilities-not-an-object",
    ),
    # -- MCP-Protocol-Version header (§4.5, §6.3: -32020, 400) -------------------------------------------
    pytest.param(
        Case(
            _req("tools/list", request_id="no-hdr"),
            _hdrs("tools/list", drop=("MCP-Protocol-Version",)),
            400,
            -32020,
            "no-hdr",
        ),
        id="missing-protocol-version-header",
    ),
    pytest.param(
        Case(
            _req("tools/list", request_id=41),
            _hdrs("tools/list", MCP_Protocol_Version="2025-11-25"),
            400,
            -32020,
            41,
        ),
        id="protocol-version-header-differs-from-_meta",
    ),
    pytest.param(
        Case(_req("tools/list", request_id=42, version="2099-01-01"), _hdrs("tools/list"), 400, -32020, 42),
        id="_meta-version-differs-from-header",
    ),
    # -- Mcp-Method (§4.5: -32020, 400) ------------------------------------------------------------------
    pytest.param(
        Case(
            _req("tools/list", request_id="dup"),
            [*_hdrs("tools/list"), ("Mcp-Method", "tools/list")],
            400,
            -32020,
            "dup",
        ),
        id="duplicate-mcp-method-header",
    ),
    pytest.param(
        Case(_req("tools/list", request_id=51), _hdrs("tools/list", drop=("Mcp-Method",)), 400, -32020, 51),
        id="missing-mcp-method-header",
    ),
    pytest.param(
        Case(_req("tools/list", request_id=52), _hdrs("prompts/list"), 400, -32020, 52),
        id="mcp-method-differs-from-body",
    ),
    pytest.param(
        Case(_req("tools/list", request_id=53), _hdrs("tools/list", Mcp_Method="Tools/List"), 400, -32020, 53),
        id="mcp-method-value-is-case-sensitive",
    ),
    # -- Mcp-Name for the three named methods (§4.5: -32020, 400) ----------------------------------------
    pytest.param(
        Case(_req("tools/call", _CALL, 61), _hdrs("tools/call"), 400, -32020, 61), id="tools/call-missing-mcp-name"
    ),
    pytest.param(
        Case(_req("tools/call", _CALL, 62), _hdrs("tools/call", "set_price"), 400, -32020, 62),
        id="tools/call-mcp-name-differs",
    ),
    pytest.param(
        Case(_req("tools/call", _CALL, 63), _hdrs("tools/call", "ECHO"), 400, -32020, 63),
        id="tools/call-mcp-name-is-case-sensitive",
    ),
    pytest.param(
        Case(
            _req("tools/call", _CALL, 64),
            [*_hdrs("tools/call", "echo"), ("Mcp-Name", "echo")],
            400,
            -32020,
            64,
        ),
        id="tools/call-duplicate-mcp-name",
    ),
    pytest.param(
        Case(_req("prompts/get", _PROMPT, 65), _hdrs("prompts/get"), 400, -32020, 65),
        id="prompts/get-missing-mcp-name",
    ),
    pytest.param(
        Case(_req("prompts/get", _PROMPT, 66), _hdrs("prompts/get", "other"), 400, -32020, 66),
        id="prompts/get-mcp-name-differs",
    ),
    pytest.param(
        Case(_req("resources/read", _READ, 67), _hdrs("resources/read"), 400, -32020, 67),
        id="resources/read-missing-mcp-name",
    ),
    pytest.param(
        Case(_req("resources/read", _READ, 68), _hdrs("resources/read", "catalog://items/a1"), 400, -32020, 68),
        id="resources/read-mcp-name-differs",
    ),
    pytest.param(
        Case(_req("resources/read", _READ, 69), _hdrs("resources/read", _b64("catalog://nope")), 400, -32020, 69),
        id="resources/read-base64-mcp-name-differs",
    ),
    pytest.param(
        Case(_req("resources/read", _READ, 70), _hdrs("resources/read", "=?base64?!!!?="), 400, -32020, 70),
        id="resources/read-malformed-base64-mcp-name",
    ),
    # -- versions (§5: -32022, 400) ----------------------------------------------------------------------
    pytest.param(
        Case(
            _req("tools/list", request_id="v2099", version="2099-01-01"),
            _hdrs("tools/list", MCP_Protocol_Version="2099-01-01"),
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
            _req(
                "initialize",
                {"protocolVersion": PV, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
                80,
            ),
            _hdrs("initialize"),
            404,
            -32601,
            80,
        ),
        id="removed-initialize",
    ),
    pytest.param(Case(_req("ping", request_id=81), _hdrs("ping"), 404, -32601, 81), id="removed-ping"),
    pytest.param(
        Case(_req("logging/setLevel", {"level": "debug"}, 82), _hdrs("logging/setLevel"), 404, -32601, 82),
        id="removed-logging/setLevel",
    ),
    pytest.param(
        Case(_req("resources/subscribe", _READ, 83), _hdrs("resources/subscribe"), 404, -32601, 83),
        id="removed-resources/subscribe",
    ),
    pytest.param(
        Case(_req("resources/unsubscribe", _READ, 84), _hdrs("resources/unsubscribe"), 404, -32601, 84),
        id="removed-resources/unsubscribe",
    ),
    # -- size (413) --------------------------------------------------------------------------------------
    pytest.param(
        Case(
            _req("tools/call", {"name": "echo", "arguments": {"text": "x" * 4 * BODY_LIMIT}}, 91),
            _hdrs("tools/call", "echo"),
            413,
            -32600,
        ),
        id="body-over-max_body_bytes",
    ),
    pytest.param(
        Case(
            json.dumps(_req("tools/list", request_id=92)).encode().ljust(BODY_LIMIT + 1),
            _hdrs("tools/list"),
            413,
            -32600,
        ),
        id="body-one-byte-over-max_body_bytes",
    ),
    # -- DNS rebinding (§4.5: Origin 403; Host 421) ------------------------------------------------------
    pytest.param(
        Case(_req("tools/list", request_id=101), _hdrs("tools/list", Origin="https://evil.example"), 403, -32600),
        id="foreign-origin",
    ),
    pytest.param(
        Case(
            _req("tools/list", request_id=102), _hdrs("tools/list", Origin="http://localhost.evil.example"), 403, -32600
        ),
        id="origin-that-only-starts-with-localhost",
    ),
    pytest.param(
        Case(_req("tools/list", request_id=103), _hdrs("tools/list", Origin="null"), 403, -32600),
        id="null-origin",
    ),
    pytest.param(
        Case(_req("tools/list", request_id=104), _hdrs("tools/list", Host="evil.example"), 421, -32600),
        id="non-loopback-host",
    ),
    pytest.param(
        Case(_req("tools/list", request_id=105), _hdrs("tools/list", Host="127.0.0.1.evil.example:8080"), 421, -32600),
        id="host-that-only-starts-with-a-loopback-address",
    ),
]


_CAFE = {"uri": "catalog://items/café"}

ACCEPTED = [
    pytest.param(
        _req("tools/list", request_id="no-info", info=None),
        _hdrs("tools/list"),
        '"name": "echo"',
        id="without-clientInfo",
    ),
    pytest.param(
        _req("resources/read", _READ, "b64"),
        _hdrs("resources/read", _b64("catalog://price")),
        "price=100",
        id="base64-mcp-name-that-matches",
    ),
    pytest.param(
        _req("resources/read", _CAFE, "b64-utf8"),
        _hdrs("resources/read", _b64("catalog://items/café")),
        "item café costs 100",
        id="base64-mcp-name-of-a-non-ascii-uri",
    ),
    pytest.param(
        _req("tools/call", _CALL, "call"), _hdrs("tools/call", "echo"), '"text": "hi"', id="tools/call-with-mcp-name"
    ),
    pytest.param(
        _req("prompts/get", _PROMPT, "prompt"),
        _hdrs("prompts/get", "pricing"),
        "What is the price of a1?",
        id="prompts/get-with-mcp-name",
    ),
    pytest.param(
        _req("tools/list", request_id="lower"),
        [(key.lower(), value) for key, value in _hdrs("tools/list")],
        '"name": "echo"',
        id="header-names-in-lower-case",
    ),
    pytest.param(
        _req("tools/list", request_id="origin"),
        _hdrs("tools/list", Origin="http://localhost:6274"),
        '"name": "echo"',
        id="localhost-origin",
    ),
    pytest.param(
        _req("tools/list", request_id="origin-ip"),
        _hdrs("tools/list", Origin="http://127.0.0.1:3000"),
        '"name": "echo"',
        id="loopback-ip-origin",
    ),
    pytest.param(
        _req("tools/list", request_id="host"),
        _hdrs("tools/list", Host="localhost:1234"),
        '"name": "echo"',
        id="localhost-host-header",
    ),
]


async def _post(http: aiohttp.ClientSession, url: str, body: bytes, hdrs: HeaderList) -> tuple[int, Any]:
    async with http.post(url, data=body, headers=hdrs) as resp:
        raw = await resp.read()
        return resp.status, (json.loads(raw) if raw else None)


@pytest.mark.invariant(15)
@pytest.mark.parametrize("case", REJECTED)
async def test_bad_input_gets_its_json_rpc_error_and_http_status(
    case: Case, sidecar: Sidecar, modern_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    status, reply = await _post(http, sidecar.url, case.encoded(), case.headers)
    assert status == case.status, reply
    assert reply["jsonrpc"] == "2.0"
    assert reply["id"] == case.echoed_id
    assert reply["error"]["code"] == case.code
    assert reply["error"]["message"]
    assert "Traceback" not in json.dumps(reply)
    for key, value in case.data.items():
        assert reply["error"]["data"][key] == value
    if case.echoed_id is not None:
        # Refused at the door: the upstream never saw it.
        assert case.echoed_id not in [entry["id"] for entry in await modern_upstream.log()]


@pytest.mark.parametrize(("body", "hdrs", "shows"), ACCEPTED)
async def test_good_edge_cases_are_served(
    body: dict[str, Any], hdrs: HeaderList, shows: str, sidecar: Sidecar, http: aiohttp.ClientSession
) -> None:
    status, reply = await _post(http, sidecar.url, json.dumps(body).encode(), hdrs)
    assert status == 200, reply
    assert reply["id"] == body["id"]
    assert reply["result"]["resultType"] == "complete"
    assert shows in json.dumps(reply["result"], ensure_ascii=False)


async def test_body_exactly_at_the_limit_is_served(sidecar: Sidecar, http: aiohttp.ClientSession) -> None:
    body = json.dumps(_req("tools/list", request_id="full")).encode().ljust(BODY_LIMIT)
    status, reply = await _post(http, sidecar.url, body, _hdrs("tools/list"))
    assert status == 200, reply
    assert "tools" in reply["result"]


async def test_chunked_body_over_the_limit_is_refused_with_413(sidecar: Sidecar, http: aiohttp.ClientSession) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"pad": "'
        for _ in range(4):
            yield b"x" * 1024
        yield b'"}}'

    async with http.post(sidecar.url, data=chunks(), headers=_hdrs("tools/list")) as resp:
        assert resp.request_info.headers.get("Transfer-Encoding") == "chunked"
        assert resp.status == 413
        reply = await resp.json()
    assert reply["error"]["code"] == -32600


async def test_unknown_method_gets_the_upstreams_method_not_found(
    sidecar: Sidecar, modern_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    status, reply = await _post(http, sidecar.url, json.dumps(_req("shop/frobnicate", request_id="u1")).encode(),
                                _hdrs("shop/frobnicate"))  # fmt: skip
    assert reply["id"] == "u1"
    assert reply["error"]["code"] == -32601
    assert status == 404
    assert "u1" in [entry["id"] for entry in await modern_upstream.log()]  # the upstream answered it


async def test_notification_under_a_modern_envelope_is_accepted_with_202(
    sidecar: Sidecar, http: aiohttp.ClientSession
) -> None:
    body = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1, "_meta": META}}
    async with http.post(sidecar.url, json=body, headers=_hdrs("notifications/cancelled")) as resp:
        assert resp.status == 202
        assert await resp.read() == b""


@pytest.mark.parametrize("verb", ["GET", "DELETE"])
async def test_get_and_delete_on_the_endpoint_are_405(verb: str, sidecar: Sidecar, http: aiohttp.ClientSession) -> None:
    async with http.request(verb, sidecar.url, headers={"Accept": "text/event-stream"}) as resp:
        assert resp.status == 405
        assert "POST" in resp.headers.get("Allow", "")


@pytest.mark.invariant(15)
async def test_bad_input_never_affects_other_clients(sidecar: Sidecar, http: aiohttp.ClientSession) -> None:
    async def attacker() -> None:
        for param in REJECTED:
            (case,) = param.values
            assert isinstance(case, Case)
            status, _ = await _post(http, sidecar.url, case.encoded(), case.headers)
            assert status == case.status, param.id

    async def bystander(client: aiohttp.ClientSession, request_id: str) -> str:
        status, reply = await rpc(client, sidecar.url, "resources/read", _READ, request_id=request_id)
        assert (status, reply["id"]) == (200, request_id)
        text: str = reply["result"]["contents"][0]["text"]
        return text

    async with aiohttp.ClientSession() as other_client:
        during = await asyncio.gather(attacker(), *(bystander(other_client, f"during-{n}") for n in range(10)))
        assert during[1:] == ["price=100"] * 10
        assert await bystander(other_client, "after") == "price=100"  # and the sidecar is still up afterwards
