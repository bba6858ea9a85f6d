"""No credential crossing: one authorization context per set of identifying headers (invariant 18).

Real SDK upstreams throughout: one that authenticates once per session (`--session-auth`: the session
is its opener's, whatever later requests carry), one protected per request (`--auth`), and the plain
one, whose `catalog://profile` names the caller (its `Authorization`, else its `X-Api-Key`).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from tests.kit import (
    LEGACY_HEADERS,
    LEGACY_INITIALIZE,
    ListenStream,
    headers,
    request,
    rpc,
    serve_sidecar,
    sse_messages,
)
from tests.peers import start_upstream

PROFILE = "catalog://profile"
PRICE = "catalog://price"


async def _read(
    http: aiohttp.ClientSession, url: str, uri: str, extra: CIMultiDict[str] | dict[str, str]
) -> tuple[int, Any]:
    # A list of pairs: aiohttp sends a repeated header only that way (a CIMultiDict's last value wins).
    all_headers = [*headers("resources/read", uri).items(), *extra.items()]
    async with http.post(url, json=request("resources/read", {"uri": uri}), headers=all_headers) as resp:
        return resp.status, await resp.json(content_type=None)


def _text(message: Any) -> str | None:
    result = message.get("result") if isinstance(message, dict) else None
    return result["contents"][0]["text"] if isinstance(result, dict) else None


@pytest.mark.invariant(18)
@pytest.mark.parametrize("spelling", ["Authorization", "authorization", "AUTHORIZATION"])
async def test_a_session_opened_for_one_user_never_carries_another_users_requests(
    spelling: str, http: aiohttp.ClientSession
) -> None:
    # A 2025-11-25 upstream that binds identity to the session: whoever rides Alice's session is Alice.
    async with (
        await start_upstream("legacy", session_auth=True) as upstream,
        serve_sidecar(upstream.url) as sidecar,
    ):
        status, message = await _read(http, sidecar.url, PROFILE, {spelling: "Bearer alice"})
        assert status == 200 and _text(message) == "profile of alice v1"

        status, message = await _read(http, sidecar.url, PROFILE, {})  # anonymous: no session of its own upstream
        assert _text(message) != "profile of alice v1", "an anonymous client was served as Alice"
        assert status == 401

        status, message = await _read(http, sidecar.url, PROFILE, {"authorization": "Bearer bob"})
        assert status == 200 and _text(message) == "profile of bob v1"


@pytest.mark.invariant(18)
@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_a_2025_session_answers_only_the_credential_that_opened_it(era: str, http: aiohttp.ClientSession) -> None:
    # A 2025-11-25 client's session with the sidecar is Alice's: the same session id with Bob's token, or none,
    # is a session nobody opened for them (404: the client initializes its own), never a ride on Alice's.
    async with await start_upstream(era, session_auth=True) as upstream, serve_sidecar(upstream.url) as sidecar:
        alice = {"Authorization": "Bearer alice"}
        async with http.post(sidecar.url, json=LEGACY_INITIALIZE, headers={**LEGACY_HEADERS, **alice}) as resp:
            assert resp.status == 200, await resp.text()
            session = resp.headers["Mcp-Session-Id"]

        async def read_on_session(extra: dict[str, str]) -> tuple[int, Any]:
            sent = {**LEGACY_HEADERS, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25", **extra}
            body = request("resources/read", {"uri": PROFILE}, 2)
            async with http.post(sidecar.url, json=body, headers=sent) as resp:
                if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                    return resp.status, [message async for message in sse_messages(resp)][-1]
                return resp.status, await resp.json(content_type=None)

        status, message = await read_on_session(alice)
        assert status == 200 and _text(message) == "profile of alice v1"
        for other in ({"authorization": "Bearer bob"}, {}):
            status, message = await read_on_session(other)
            assert status == 404, message
            assert _text(message) is None, "another credential was served on Alice's session"
        status, message = await read_on_session({"AUTHORIZATION": "Bearer alice"})  # any spelling of hers
        assert status == 200 and _text(message) == "profile of alice v1"


@pytest.mark.invariant(18)
async def test_a_request_with_two_authorization_headers_is_refused_before_reaching_anyone(
    http: aiohttp.ClientSession,
) -> None:
    async with await start_upstream("modern") as upstream, serve_sidecar(upstream.url) as sidecar:
        await upstream.reset_log()
        twice = CIMultiDict([("Authorization", "Bearer mallory"), ("Authorization", "Bearer alice")])
        status, message = await _read(http, sidecar.url, PRICE, twice)
        assert status == 400 and message["error"]["code"] == -32600
        assert "authorization" in message["error"]["message"].lower()
        assert await upstream.log() == []


@pytest.mark.invariant(18)
async def test_every_forwarded_header_but_the_declared_trace_headers_identifies_the_client(
    http: aiohttp.ClientSession,
) -> None:
    forward = {"forward_headers": ["authorization", "x-api-key", "traceparent"]}
    # A private profile cached for a second: a shared context would serve Alice's to Bob from the cache.
    async with (
        await start_upstream("modern", read_ttl_ms=60_000) as upstream,
        serve_sidecar(upstream.url, upstream=forward) as sidecar,
    ):
        status, alice = await _read(http, sidecar.url, PROFILE, {"X-Api-Key": "alice", "traceparent": "00-a-b-01"})
        assert status == 200 and _text(alice) == "profile of alice v1"
        status, bob = await _read(http, sidecar.url, PROFILE, {"X-Api-Key": "bob", "traceparent": "00-a-b-01"})
        assert status == 200 and _text(bob) == "profile of bob v1"
        # A different trace header alone is the same client: its cached answer is reused.
        await upstream.reset_log()
        status, again = await _read(http, sidecar.url, PROFILE, {"X-Api-Key": "alice", "traceparent": "00-c-d-01"})
        assert _text(again) == "profile of alice v1" and await upstream.count("resources/read") == 0


async def test_a_cached_public_answer_reaches_only_clients_the_upstream_has_answered(
    http: aiohttp.ClientSession,
) -> None:
    async with (
        await start_upstream("modern", read_ttl_ms=60_000, auth=True) as upstream,
        serve_sidecar(upstream.url) as sidecar,
    ):
        await upstream.grant("alice")
        status, message = await _read(http, sidecar.url, PRICE, {"Authorization": "Bearer alice"})
        assert status == 200 and message["result"]["cacheScope"] == "public"

        status, message = await _read(http, sidecar.url, PRICE, {"Authorization": "Bearer mallory"})
        assert status == 401, "a client the upstream refuses was served the public answer from the cache"
        status, message = await _read(http, sidecar.url, PRICE, {})
        assert status == 401

        await upstream.reset_log()
        status, message = await _read(http, sidecar.url, PRICE, {"Authorization": "Bearer alice"})
        assert status == 200 and await upstream.count("resources/read") == 0  # Alice is served from the cache

    # Turned off, the spec's own rule applies: a public answer is anyone's.
    async with (
        await start_upstream("modern", read_ttl_ms=60_000, auth=True) as upstream,
        serve_sidecar(upstream.url, cache={"public_requires_verified_context": False}) as sidecar,
    ):
        await upstream.grant("alice")
        await _read(http, sidecar.url, PRICE, {"Authorization": "Bearer alice"})
        status, _ = await _read(http, sidecar.url, PRICE, {"Authorization": "Bearer mallory"})
        assert status == 200


async def test_a_client_refused_a_read_of_a_uri_it_watches_stops_being_told_of_it(
    http: aiohttp.ClientSession,
) -> None:
    polling = {"default_interval_ms": 200, "min_interval_ms": 50, "max_interval_ms": 200}
    async with (
        await start_upstream("modern", read_ttl_ms=200, auth=True) as upstream,
        serve_sidecar(upstream.url, polling=polling) as sidecar,
    ):
        await upstream.grant("alice")
        await upstream.grant("bob")
        alice = ListenStream(http, sidecar.url, "a", [PRICE], authorization="Bearer alice")
        bob = ListenStream(http, sidecar.url, "b", [PRICE], authorization="Bearer bob")
        await alice.open()
        await bob.open()
        try:
            await upstream.revoke("bob")
            status, _ = await _read(http, sidecar.url, PRICE, {"Authorization": "Bearer bob"})
            assert status == 401
            # Bob's stream ends with its final result, though the public watch is still polled as Alice.
            end = await bob.next()
            assert end.get("result", {}).get("resultType") == "complete", end
            await upstream.set_price(150)
            update = await alice.next()
            assert update["params"]["uri"] == PRICE
            assert (await rpc(http, sidecar.url, "resources/read", {"uri": PRICE}, extra_headers=_bearer("alice")))[1][
                "result"
            ]["contents"][0]["text"] == "price=150"
        finally:
            await alice.close()
            await bob.close()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
