"""Auth and isolation through the sidecar, against a real OAuth-protected SDK upstream (`shop_server --auth`).

- `Authorization` reaches the upstream exactly as the client sent it, and no log record ever holds it.
- A 401 or 403 from the upstream reaches the client with its `WWW-Authenticate`; with `upstream.public_url`
  the challenge's `resource_metadata` names the sidecar, which serves the upstream's protected-resource
  metadata (RFC 9728) rewritten to name itself.
- A poll refused with 401/403 ends that context's streams with the final result, and nobody else's.
- A property over several users: no notification, cached result or read answer crosses authorization
  contexts, for private results (modern upstream) and results of unknown scope (2025-11-25 upstream),
  while public data is one watch for everyone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from sidecar.app import HUB, METRICS
from tests.kit import (
    SUB_ID_KEY,
    ListenStream,
    Sidecar,
    headers,
    request,
    rpc,
    serve_sidecar,
)
from tests.peers import Upstream, start_upstream

PRICE = "catalog://price"
PROFILE = "catalog://profile"
POLLING = {"min_interval_ms": 50, "default_interval_ms": 150, "max_interval_ms": 150, "linger_ms": 100}
PUBLIC_URL = "https://mcp.example.com/mcp"

pytestmark = pytest.mark.usefixtures("tokens_never_logged")  # tests/integration/conftest.py


@pytest.fixture
async def protected() -> AsyncIterator[Upstream]:
    async with await start_upstream("modern", read_ttl_ms=150, list_ttl_ms=150, auth=True) as up:
        yield up


def _bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


async def _read(
    http: aiohttp.ClientSession, sidecar: Sidecar, uri: str, token: str | None, request_id: Any = 1
) -> tuple[int, dict[str, str], Any]:
    """(status, response headers, body) of one read, whatever the body is."""
    body = request("resources/read", {"uri": uri}, request_id)
    async with http.post(sidecar.url, json=body, headers=headers("resources/read", uri, **_bearer(token))) as resp:
        return resp.status, dict(resp.headers), await resp.json(content_type=None)


# -- forwarding --------------------------------------------------------------------------------------------


async def test_authorization_reaches_the_upstream_unchanged_on_requests_and_polls(
    protected: Upstream, http: aiohttp.ClientSession
) -> None:
    token = "tok-Alpha.9~+/="
    await protected.grant(token)
    async with serve_sidecar(protected.url, polling=POLLING) as sidecar:
        status, _, reply = await _read(http, sidecar, PROFILE, token, "fwd-read")
        assert status == 200 and reply["result"]["contents"][0]["text"] == f"profile of {token} v1", reply
        status, reply = await rpc(
            http, sidecar.url, "tools/call", {"name": "echo", "arguments": {"text": "hi"}},
            request_id="fwd-call", extra_headers={**_bearer(token), "Cookie": "sid=1", "X-Api-Key": "k"},
        )  # fmt: skip
        assert status == 200 and reply["result"]["content"][0]["text"] == "hi"
        stream = ListenStream(http, sidecar.url, "fwd-listen", [PROFILE], authorization=f"Bearer {token}")
        await stream.open()
        try:
            await protected.bump_profile(token)
            assert (await stream.next())["params"]["uri"] == PROFILE
        finally:
            await stream.close()
    log = await protected.log()
    by_id = {entry["id"]: entry for entry in log}
    assert by_id["fwd-read"]["authorization"] == f"Bearer {token}"
    assert by_id["fwd-call"]["authorization"] == f"Bearer {token}"
    polls = [entry for entry in log if entry["method"] == "resources/read" and entry["id"] != "fwd-read"]
    assert polls and {entry["authorization"] for entry in polls} == {f"Bearer {token}"}


# -- challenges and metadata -------------------------------------------------------------------------------


@pytest.mark.parametrize("public_url", [None, PUBLIC_URL], ids=["as-sent", "rewritten"])
async def test_a_401_or_403_reaches_the_client_with_its_challenge(
    public_url: str | None, protected: Upstream, http: aiohttp.ClientSession
) -> None:
    await protected.grant("alice")
    await protected.grant("bob")
    await protected.forbid("bob")
    upstream_metadata = f"{protected.base_url}/.well-known/oauth-protected-resource/mcp"
    rewritten = "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
    metadata = upstream_metadata if public_url is None else rewritten
    async with serve_sidecar(protected.url, upstream={"public_url": public_url}) as sidecar:
        status, _, reply = await _read(http, sidecar, PRICE, "alice")
        assert status == 200, reply  # the sidecar learns the upstream with a good token first

        # Each read below is of a URI nobody read yet: a public result already cached would be served to anyone
        # (cacheScope "public" allows that), and the point here is what the upstream answers.
        status, got, reply = await _read(http, sidecar, "catalog://items/anon", None, "anon")
        assert status == 401, reply
        assert got["WWW-Authenticate"] == f'Bearer resource_metadata="{metadata}"'
        assert reply["error"] == "invalid_token"

        status, got, reply = await _read(http, sidecar, "catalog://items/mallory", "mallory", "unknown")
        assert status == 401 and got["WWW-Authenticate"] == f'Bearer resource_metadata="{metadata}"'

        status, got, reply = await _read(http, sidecar, "catalog://items/bob", "bob", "scoped")
        assert status == 403, reply
        assert got["WWW-Authenticate"] == (
            f'Bearer error="insufficient_scope", scope="shop", resource_metadata="{metadata}"'
        )

        status, reply = await rpc(http, sidecar.url, "tools/list", request_id="list")
        assert status == 401  # every forwarded method, not only reads


async def test_a_401_on_the_first_request_reaches_the_client_too(
    protected: Upstream, http: aiohttp.ClientSession
) -> None:
    # The sidecar has not probed the upstream yet: the probe itself is refused, and that refusal is the answer.
    async with serve_sidecar(protected.url, upstream={"public_url": PUBLIC_URL}) as sidecar:
        status, got, reply = await _read(http, sidecar, PRICE, None, "first")
        assert status == 401, reply
        assert "mcp.example.com/.well-known/oauth-protected-resource/mcp" in got["WWW-Authenticate"]
        assert protected.base_url not in got["WWW-Authenticate"]


@pytest.mark.parametrize("public_url", [None, PUBLIC_URL], ids=["own-url", "public-url"])
@pytest.mark.parametrize("path", ["/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"])
async def test_protected_resource_metadata_is_the_upstreams_naming_the_sidecar(
    public_url: str | None, path: str, protected: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(protected.url, upstream={"public_url": public_url}) as sidecar:
        async with http.get(sidecar.base_url + path) as resp:
            assert resp.status == 200
            document = await resp.json()
    assert document["resource"] == (public_url or sidecar.url)
    # Everything else is the upstream's: clients still go to its authorization server for tokens.
    assert document["authorization_servers"] == [f"{protected.base_url}/oauth"]
    assert document["scopes_supported"] == ["shop"]


@pytest.mark.invariant(10)
async def test_a_cached_public_answer_is_not_served_to_a_context_the_upstream_has_not_answered(
    http: aiohttp.ClientSession,
) -> None:
    async with (
        await start_upstream("modern", read_ttl_ms=60_000, auth=True) as up,
        serve_sidecar(up.url, polling=POLLING) as sidecar,
    ):
        await up.grant("alice")
        await up.grant("bob")
        await up.forbid("bob")
        hits = sidecar.app[METRICS].cache_hits
        for _ in range(2):  # the second read is served from the cache: the entry is there for anyone to get
            status, _, reply = await _read(http, sidecar, PRICE, "alice")
            assert status == 200 and reply["result"]["cacheScope"] == "public", reply
        assert hits._value.get() == 1
        status, _, reply = await _read(http, sidecar, PRICE, "bob", "bob")
        assert status == 403, reply
        status, _, reply = await _read(http, sidecar, PRICE, None, "anon")
        assert status == 401, reply
        assert hits._value.get() == 1


# -- a poll refused with 401/403 -------------------------------------------------------------------------------


def _is_complete(frame: dict[str, Any], request_id: str) -> bool:
    return frame.get("id") == request_id and frame.get("result", {}).get("resultType") == "complete"


@pytest.mark.invariant(10)
@pytest.mark.parametrize("era", ["modern", "legacy"])
@pytest.mark.parametrize("refusal", ["revoke", "forbid"], ids=["401", "403"])
async def test_a_refused_poll_ends_that_contexts_streams_with_the_final_result_and_no_one_elses(
    era: Any, refusal: str, http: aiohttp.ClientSession
) -> None:
    async with (
        await start_upstream(era, read_ttl_ms=150, list_ttl_ms=150, auth=True) as up,
        serve_sidecar(up.url, polling=POLLING) as sidecar,
    ):
        for token in ("alice", "bob", "alice-again"):
            await up.grant(token)
        # Alice holds the price (public on a modern upstream: one watch, polled with one holder's token) in a
        # stream of its own, so that watch, not only her private one, meets her refused token.
        alice_price = ListenStream(http, sidecar.url, "alice-price", [PRICE], authorization="Bearer alice")
        alice_profile = ListenStream(http, sidecar.url, "alice-profile", [PROFILE], authorization="Bearer alice")
        bob = ListenStream(http, sidecar.url, "bob", [PROFILE, PRICE], authorization="Bearer bob")
        streams = (alice_price, alice_profile, bob)
        try:
            for stream in streams:
                ack = await stream.open()
                assert ack["params"]["notifications"]["resourceSubscriptions"], ack
            await (up.revoke if refusal == "revoke" else up.forbid)("alice")
            for stream in (alice_price, alice_profile):
                final = await stream.next()
                assert _is_complete(final, stream.request_id), final
                assert final["result"]["_meta"] == {SUB_ID_KEY: stream.request_id}
            assert sidecar.app[METRICS].streams_ended.labels("auth")._value.get() == 2

            # Bob's stream is untouched: open, and told of his changes and of the shared price.
            await up.bump_profile("bob")
            assert (await bob.next())["params"] == {"_meta": {SUB_ID_KEY: "bob"}, "uri": PROFILE}
            await up.set_price(321)
            assert (await bob.next())["params"]["uri"] == PRICE
            assert sidecar.app[HUB].stream_count == 1

            # Alice, re-authenticated, listens again and gets a fresh ack.
            again = ListenStream(http, sidecar.url, "alice-2", [PROFILE], authorization="Bearer alice-again")
            ack = await again.open()
            await again.close()
            assert ack["params"]["notifications"]["resourceSubscriptions"] == [PROFILE]
        finally:
            for stream in streams:
                await stream.close()


# -- a property: nothing crosses authorization contexts ---------------------------------------------------
