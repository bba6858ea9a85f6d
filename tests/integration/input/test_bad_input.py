"""Bad input gets the error protocol.md §4.3, §4.5 and §5 prescribe, and never takes the sidecar down.

Every case is one raw POST (aiohttp, so the headers are exactly what the case says) to a sidecar in
front of a real modern upstream. The upstream subprocess is shared by the whole module (it takes a
second and a half to start); each test gets its own sidecar.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.integration.input.bad_input_cases import ACCEPTED, BODY_LIMIT, READ, REJECTED, Case, HeaderList, hdrs, req
from tests.kit import META, Sidecar, rpc, serve_sidecar
from tests.peers import Upstream, start_upstream

pytestmark = pytest.mark.asyncio(loop_scope="module")


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
    body = json.dumps(req("tools/list", request_id="full")).encode().ljust(BODY_LIMIT)
    status, reply = await _post(http, sidecar.url, body, hdrs("tools/list"))
    assert status == 200, reply
    assert "tools" in reply["result"]


async def test_chunked_body_over_the_limit_is_refused_with_413(sidecar: Sidecar, http: aiohttp.ClientSession) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"pad": "'
        for _ in range(4):
            yield b"x" * 1024
        yield b'"}}'

    async with http.post(sidecar.url, data=chunks(), headers=hdrs("tools/list")) as resp:
        assert resp.request_info.headers.get("Transfer-Encoding") == "chunked"
        assert resp.status == 413
        reply = await resp.json()
    assert reply["error"]["code"] == -32600


async def test_unknown_method_gets_the_upstreams_method_not_found(
    sidecar: Sidecar, modern_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    status, reply = await _post(http, sidecar.url, json.dumps(req("shop/frobnicate", request_id="u1")).encode(),
                                hdrs("shop/frobnicate"))  # fmt: skip
    assert reply["id"] == "u1"
    assert reply["error"]["code"] == -32601
    assert status == 404
    assert "u1" in [entry["id"] for entry in await modern_upstream.log()]  # the upstream answered it


async def test_notification_under_a_modern_envelope_is_accepted_with_202(
    sidecar: Sidecar, http: aiohttp.ClientSession
) -> None:
    body = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1, "_meta": META}}
    async with http.post(sidecar.url, json=body, headers=hdrs("notifications/cancelled")) as resp:
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
        status, reply = await rpc(client, sidecar.url, "resources/read", READ, request_id=request_id)
        assert (status, reply["id"]) == (200, request_id)
        text: str = reply["result"]["contents"][0]["text"]
        return text

    async with aiohttp.ClientSession() as other_client:
        during = await asyncio.gather(attacker(), *(bystander(other_client, f"during-{n}") for n in range(10)))
        assert during[1:] == ["price=100"] * 10
        assert await bystander(other_client, "after") == "price=100"  # and the sidecar is still up afterwards
