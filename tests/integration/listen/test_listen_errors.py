"""A listen or subscribe whose first read fails says why: the upstream's error, its refusal, its fault; never
"Resource not found" for a resource that exists, never an empty ack that reads as "nothing to watch"."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.kit import LEGACY_HEADERS, LEGACY_INITIALIZE, headers, listen_request, serve_sidecar, sse_messages, told
from tests.peers import Upstream, start_upstream
from tests.peers.faulty import Fault, FaultyUpstream

FORBIDDEN = "catalog://forbidden"
"""Every read of it fails upstream with -32603."""
MISSING = "catalog://no-such-thing"


async def _listen(
    http: aiohttp.ClientSession, url: str, uris: list[str], extra: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    """(status, headers, first JSON-RPC message) of a listen request."""
    body = listen_request(uris, "l-1")
    async with http.post(url, json=body, headers=headers("subscriptions/listen", **(extra or {}))) as resp:
        if resp.content_type == "text/event-stream":
            return resp.status, dict(resp.headers), await anext(sse_messages(resp))
        return resp.status, dict(resp.headers), await resp.json(content_type=None)


async def _legacy_subscribe(
    http: aiohttp.ClientSession, url: str, uri: str, extra: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    """A 2025-11-25 client: initialize, then resources/subscribe; (status, headers, answer) of the subscribe."""
    base = {**LEGACY_HEADERS, **(extra or {})}
    async with http.post(url, json=LEGACY_INITIALIZE, headers=base) as resp:
        assert resp.status == 200, await resp.text()
        session = resp.headers["Mcp-Session-Id"]
    session_headers = {**base, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    subscribe = {"jsonrpc": "2.0", "id": 2, "method": "resources/subscribe", "params": {"uri": uri}}
    async with http.post(url, json=subscribe, headers=session_headers) as resp:
        return resp.status, dict(resp.headers), await resp.json(content_type=None)


@pytest.fixture(params=["modern", "legacy"])
async def shop(request: pytest.FixtureRequest) -> AsyncIterator[Upstream]:
    async with await start_upstream(request.param) as up:
        yield up


async def test_a_listen_whose_only_read_fails_upstream_gets_the_upstreams_error_not_an_empty_ack(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url) as sidecar:
        _, _, message = await _listen(http, sidecar.url, [FORBIDDEN])
        assert "error" in message, message  # not an acknowledgement
        assert message["id"] == "l-1"
        assert message["error"]["code"] == -32603 and "not found" not in message["error"]["message"].lower()


async def test_a_listen_with_one_good_uri_acks_it_and_leaves_the_failing_one_out(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url) as sidecar:
        status, _, message = await _listen(http, sidecar.url, [FORBIDDEN, "catalog://price"])
        assert status == 200
        assert message["params"]["notifications"]["resourceSubscriptions"] == ["catalog://price"]


async def test_a_listen_on_a_missing_resource_is_acked_without_it(shop: Upstream, http: aiohttp.ClientSession) -> None:
    async with serve_sidecar(shop.url) as sidecar:
        status, _, message = await _listen(http, sidecar.url, [MISSING])
        assert status == 200 and message["method"] == "notifications/subscriptions/acknowledged"
        assert "resourceSubscriptions" not in message["params"]["notifications"]


async def test_a_2025_subscribe_whose_read_fails_upstream_gets_that_error_and_a_missing_one_gets_32002(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url) as sidecar:
        _, _, answer = await _legacy_subscribe(http, sidecar.url, FORBIDDEN)
        assert answer["error"]["code"] != -32002 and "not found" not in answer["error"]["message"].lower(), answer
        _, _, answer = await _legacy_subscribe(http, sidecar.url, MISSING)
        assert answer["error"]["code"] == -32002 and answer["error"]["data"]["uri"] == MISSING


@pytest.mark.parametrize("fault", [Fault.HTML_500, Fault.NOT_JSON, Fault.HANG])
async def test_a_listen_whose_read_hits_an_upstream_fault_names_the_fault(
    fault: Fault, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    reasons = {
        Fault.HTML_500: "HTTP 500 Internal Server Error",
        Fault.NOT_JSON: "answer is not JSON",
        Fault.HANG: "no answer in time",
    }
    # A 2025-11-25 upstream, so that the same sidecar also serves the 2025 client's session.
    async with FaultyUpstream(era="legacy") as up, serve_sidecar(up.url, upstream={"timeout_s": 0.5}) as sidecar:
        up.fail(fault, uri="fault://x")
        status, _, message = await _listen(http, sidecar.url, ["fault://x"])
        assert status in (502, 504), message
        # What failed, in a fixed phrase; the reason is in the log line its error id names.
        assert message["error"]["code"] == -32603 and told(message["error"], caplog.records)["reason"] == reasons[fault]
        _, _, answer = await _legacy_subscribe(http, sidecar.url, "fault://x")
        assert answer["error"]["code"] == -32603 and told(answer["error"], caplog.records)["reason"] == reasons[fault]


async def test_a_listen_with_a_token_the_upstream_refuses_gets_401_and_its_challenge(
    http: aiohttp.ClientSession,
) -> None:
    async with await start_upstream("modern", auth=True) as protected, serve_sidecar(protected.url) as sidecar:
        await protected.grant("alice")
        status, _, message = await _listen(http, sidecar.url, ["catalog://price"], {"Authorization": "Bearer alice"})
        assert status == 200 and message["params"]["notifications"]["resourceSubscriptions"] == ["catalog://price"]

        status, response_headers, message = await _listen(
            http, sidecar.url, ["catalog://price", "catalog://profile"], {"Authorization": "Bearer mallory"}
        )
        assert status == 401, message
        assert "resource_metadata=" in response_headers["WWW-Authenticate"]
        assert message["id"] == "l-1" and "error" in message

        status, response_headers, answer = await _legacy_subscribe(
            http, sidecar.url, "catalog://price", {"Authorization": "Bearer alice"}
        )
        assert "error" not in answer, answer
