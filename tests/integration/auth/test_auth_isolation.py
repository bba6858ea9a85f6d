"""A property: nothing crosses authorization contexts. Three users, each with a listen stream on their own profile
and the shared price, bump their profile, change the price and read, interleaved at random (hypothesis): no
notification, cached result or answer ever reaches another context, and each read is as fresh as what its user
was told. One upstream and one sidecar per era, kept on a loop thread across the examples."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.app import REGISTRY
from sidecar.identity import PUBLIC
from sidecar.watch.registry import WatchSummary
from tests.kit import (
    UPDATED,
    WAIT_S,
    ListenStream,
    context_of,
    eventually,
    loop_thread,
    read_resource,
    serve_sidecar,
    text_of,
)
from tests.kit.loop_thread import World as ThreadWorld
from tests.peers import start_upstream

PRICE = "catalog://price"
PROFILE = "catalog://profile"
POLLING = {"min_interval_ms": 50, "default_interval_ms": 150, "max_interval_ms": 150, "linger_ms": 100}

pytestmark = pytest.mark.usefixtures("tokens_never_logged")  # tests/integration/conftest.py


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


@dataclass(kw_only=True)
class World(ThreadWorld):
    """One upstream, one sidecar and one listen stream per user ([PROFILE, PRICE]), on a loop in a thread."""

    era: str
    versions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USERS, 1))
    price: int = 100

    def _watch(self, uri: str, user: str) -> WatchSummary:
        """`user`'s watch of `uri` as it is now (its own, or the public one)."""
        assert self.sidecar is not None
        contexts = (context_of(self.sidecar, f"Bearer {user}"), PUBLIC)
        registry = self.sidecar.app[REGISTRY]
        (watch,) = [w for w in registry.watches() if w.key.uri == uri and w.key.context in contexts]
        return watch

    async def _polled_since(self, uri: str, user: str, since: float) -> None:
        await eventually(lambda: (self._watch(uri, user).last_poll_at or 0) > since, within_s=WAIT_S)

    async def read(self, user: str) -> None:
        assert self.http is not None and self.sidecar is not None
        for uri in (PROFILE, PRICE):
            self.requests += 1
            reply = await read_resource(self.http, self.sidecar.url, uri, f"{user}-{self.requests}", user)
            text = text_of(reply)
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
                await self._polled_since(PROFILE, other, started)
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
        yield from _world(World(era=request.param, thread=thread))


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
