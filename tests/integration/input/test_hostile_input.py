"""Bad input that used to be a 500: JSON nested past the encoders' depth, malformed Host and Origin headers,
malformed HTTP. Each gets its 400, and nothing is logged above a warning (once per cause).

The SDK shop server upstream and the sidecar served as in production; the malformed HTTP comes from raw sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.kit import headers, request, rpc, serve_sidecar
from tests.peers import Upstream, start_upstream

PRICE = "catalog://price"


@pytest.fixture
async def shop() -> AsyncIterator[Upstream]:
    async with await start_upstream("modern", read_ttl_ms=60_000) as up:
        yield up


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(("method", "params"), [("tools/call", "name"), ("resources/read", "uri")])
async def test_params_nested_deeper_than_json_encoders_go_get_400(
    method: str, params: str, shop: Upstream, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    deep = {params: "echo" if params == "name" else PRICE, "arguments": _nested(300)}
    async with serve_sidecar(shop.url) as sidecar:
        with caplog.at_level(logging.WARNING):
            status, message = await rpc(http, sidecar.url, method, deep)
        assert status == 400 and message["error"]["code"] == -32600, message
        assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


@pytest.mark.parametrize(("name", "value"), [("Host", "["), ("Origin", "http://[")])
async def test_malformed_host_and_origin_headers_get_400(
    name: str, value: str, shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url) as sidecar:
        body = request("tools/list")
        async with http.post(sidecar.url, json=body, headers={**headers("tools/list"), name: value}) as resp:
            assert resp.status == 400
            assert (await resp.json(content_type=None))["error"]["code"] == -32600


async def test_malformed_http_is_logged_once_per_cause_at_warning(
    shop: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    async with serve_sidecar(shop.url) as sidecar:
        port = int(sidecar.base_url.rsplit(":", 1)[1])
        with caplog.at_level(logging.DEBUG, logger="aiohttp.server"):
            for _ in range(20):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: nope\r\n\r\n")
                await writer.drain()
                with contextlib.suppress(ConnectionError):
                    async with asyncio.timeout(15):
                        assert b" 400 " in await reader.readuntil(b"\r\n")
                writer.close()
        records = [record for record in caplog.records if record.name == "aiohttp.server"]
        assert not [record for record in records if record.levelno >= logging.ERROR]
        assert len([record for record in records if record.levelno == logging.WARNING]) <= 1
