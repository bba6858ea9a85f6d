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

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.app import HUB, METRICS, REGISTRY
from sidecar.identity import PUBLIC
from sidecar.watch.poller import Watch
from tests.kit import (
    SUB_ID_KEY,
    UPDATED,
    ListenStream,
    LoopThread,
    Sidecar,
    context_of,
    eventually,
    headers,
    loop_thread,
    request,
    rpc,
    serve_sidecar,
)
from tests.peers import Upstream, start_upstream

T = TypeVar("T")

PRICE = "catalog://price"
PROFILE = "catalog://profile"
WAIT_S = 15.0
POLLING = {"min_interval_ms": 50, "default_interval_ms": 150, "max_interval_ms": 150, "linger_ms": 100}
PUBLIC_URL = "https://mcp.example.com/mcp"
TOKENS = ("tok-Alpha.9~+/=", "alice", "bob", "u1", "u2", "u3", "alice-again")
"""Every token a test here sends: none may appear in any log record."""


@pytest.fixture(autouse=True)
def tokens_never_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Every test runs with the sidecar logging at debug; no record (message, arguments, extra fields or
    traceback) may contain a token or the Bearer scheme."""
    caplog.set_level(logging.DEBUG)
    yield
    for record in caplog.records:
        if not record.name.startswith("sidecar"):
            continue
        text = f"{record.getMessage()} {record.exc_text or ''} {vars(record)}"
        for secret in (*TOKENS, "Bearer"):
            assert secret not in text, f"{secret!r} logged by {record.name}: {record.getMessage()}"


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

USERS = ("u1", "u2", "u3")
Step = tuple[str, str]
"""("bump", user), ("price", ""), ("read", user) or ("read_all", "")."""

steps = st.lists(
    st.one_of(
        st.tuples(st.just("bump"), st.sampled_from(USERS)),
        st.just(("price", "")),
        st.tuples(st.just("read"), st.sampled_from(USERS)),
        st.just(("read_all", "")),
    ),
    min_size=1,
    max_size=6,
)


@dataclass
class World:
    """One upstream, one sidecar and one listen stream per user ([PROFILE, PRICE]), on a loop in a thread."""

    era: str
    thread: LoopThread
    up: Upstream | None = None
    sidecar: Sidecar | None = None
    http: aiohttp.ClientSession | None = None
    streams: dict[str, ListenStream] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USERS, 1))
    price: int = 100
    requests: int = 0

    def run(self, make: Callable[[], Awaitable[T]], timeout_s: float = 60.0) -> T:
        return self.thread.run(make, timeout_s)

    def _watch(self, uri: str, user: str) -> Watch:
        assert self.sidecar is not None
        contexts = (context_of(self.sidecar, f"Bearer {user}"), PUBLIC)
        registry = self.sidecar.app[REGISTRY]
        (watch,) = [w for w in registry.watches() if w.key.uri == uri and w.key.context in contexts]
        return watch

    async def _polled_since(self, watch: Watch, since: float) -> None:
        await eventually(lambda: (watch.last_poll_at or 0) > since, within_s=WAIT_S)

    async def read(self, user: str) -> None:
        assert self.http is not None and self.sidecar is not None
        for uri in (PROFILE, PRICE):
            self.requests += 1
            status, reply = await rpc(
                self.http, self.sidecar.url, "resources/read", {"uri": uri},
                request_id=f"{user}-{self.requests}", extra_headers=_bearer(user),
            )  # fmt: skip
            assert status == 200, reply
            text = reply["result"]["contents"][0]["text"]
            if uri == PROFILE:
                # Never another user's profile; never older than the last update this user was told of.
                assert text == f"profile of {user} v{self.versions[user]}", (user, text, self.versions)
            else:
                assert text == f"price={self.price}", (user, text)

    async def bump(self, user: str) -> None:
        assert self.up is not None
        started = time.time()
        text = await self.up.bump_profile(user)
        self.versions[user] += 1
        assert text == f"profile of {user} v{self.versions[user]}"
        frame = await self.streams[user].next()
        assert frame["method"] == UPDATED and frame["params"]["uri"] == PROFILE, frame
        # Everyone else's profile watch has looked since, and found nothing to tell its owner.
        for other in USERS:
            if other != user:
                await self._polled_since(self._watch(PROFILE, other), started)
        await self.expect_quiet()

    async def change_price(self) -> None:
        assert self.up is not None
        self.price += 1
        await self.up.set_price(self.price)
        for user in USERS:
            frame = await self.streams[user].next()
            assert frame["method"] == UPDATED and frame["params"]["uri"] == PRICE, (user, frame)
        await self.expect_quiet()

    async def expect_quiet(self) -> None:
        for user, stream in self.streams.items():
            assert stream.pending() == [], f"{user}'s stream got frames nothing caused"

    async def apply(self, plan: list[Step]) -> None:
        for kind, user in plan:
            if kind == "bump":
                await self.bump(user)
            elif kind == "price":
                await self.change_price()
            elif kind == "read":
                await self.read(user)
            else:
                await asyncio.gather(*(self.read(name) for name in USERS))
        self.check_watches()

    def check_watches(self) -> None:
        assert self.sidecar is not None
        watches = list(self.sidecar.app[REGISTRY].watches())
        profiles = sorted(w.key.context for w in watches if w.key.uri == PROFILE)
        prices = sorted(w.key.context for w in watches if w.key.uri == PRICE)
        assert profiles == sorted(context_of(self.sidecar, f"Bearer {user}") for user in USERS)
        if self.era == "modern":
            assert prices == [PUBLIC]  # public data: one watch, polled once for everyone
        else:
            assert prices == profiles  # unknown scope: one watch per context, polled with its own token


@pytest.fixture(scope="module", params=["modern", "legacy"])
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    with loop_thread(f"auth-world-{request.param}") as thread:
        yield from _world(World(request.param, thread))


def _world(world: World) -> Iterator[World]:
    stack = contextlib.AsyncExitStack()

    async def setup() -> None:
        up = await start_upstream(world.era, read_ttl_ms=600_000, list_ttl_ms=600_000)
        world.up = await stack.enter_async_context(up)
        # Legacy results carry no ttlMs: stamped with a long one, so the cache is on for unknown scope too.
        cache = {"default_ttl_ms": 600_000}
        world.sidecar = await stack.enter_async_context(serve_sidecar(world.up.url, polling=POLLING, cache=cache))
        world.http = await stack.enter_async_context(aiohttp.ClientSession())
        for user in USERS:
            stream = ListenStream(
                world.http, world.sidecar.url, f"listen-{user}", [PROFILE, PRICE], authorization=f"Bearer {user}"
            )
            ack = await stream.open()
            assert ack["params"]["notifications"]["resourceSubscriptions"] == [PROFILE, PRICE]
            world.streams[user] = stream

    async def teardown() -> None:
        for stream in world.streams.values():
            await stream.close()
        await stack.aclose()

    try:
        world.run(setup)
        yield world
    finally:
        world.run(teardown)


@pytest.mark.invariant(10)
@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(plan=steps)
def test_no_notification_cached_result_or_answer_crosses_authorization_contexts(world: World, plan: list[Step]) -> None:
    world.run(lambda: world.apply(plan))
