"""Private results through the read-through cache, as a property: users reading, bumping their own profile and
reading all at once, interleaved at random, each only ever reads their own profile, never older than the last one
they read or were told of (hypothesis over one upstream and one sidecar kept on a loop thread across examples)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.kit import (
    ListenStream,
    loop_thread,
    read_resource,
    serve_sidecar,
    text_of,
)
from tests.kit.loop_thread import World
from tests.peers import start_upstream

PROFILE = "catalog://profile"


USERS = ("u1", "u2", "u3", "u4")


Action = tuple[str, str]
"""("read", user), ("bump", user) or ("read_all", "")."""


actions = st.lists(
    st.one_of(
        st.tuples(st.just("read"), st.sampled_from(USERS)),
        st.tuples(st.just("bump"), st.sampled_from(USERS)),
        st.just(("read_all", "")),
    ),
    min_size=1,
    max_size=12,
)


@dataclass(kw_only=True)
class ProfileWorld(World):
    """One upstream and one sidecar for every example, on an event loop of their own in a thread."""

    versions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USERS, 1))
    """Each user's current profile version at the upstream."""
    seen: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USERS, 1))
    """The newest version each user has read through the sidecar."""

    async def read(self, user: str) -> int:
        assert self.http is not None and self.sidecar is not None
        self.requests += 1
        text = text_of(await read_resource(self.http, self.sidecar.url, PROFILE, f"{user}-{self.requests}", user))
        owner, _, version = text.removeprefix("profile of ").rpartition(" v")
        assert owner == user, f"{user} was given {text!r}"
        return int(version)

    async def check_read(self, user: str) -> None:
        version = await self.read(user)
        # Stale within its ttlMs is allowed without a change event; older than already seen, or newer than
        # the upstream has, is not.
        assert self.seen[user] <= version <= self.versions[user], (user, version, self.seen, self.versions)
        self.seen[user] = version

    async def bump(self, user: str) -> None:
        assert self.up is not None
        stream = self.streams[user]
        leftover = stream.pending()
        assert leftover == [], f"{user}'s stream had frames nobody caused: {leftover}"
        text = await self.up.bump_profile(user)
        self.versions[user] += 1
        assert text == f"profile of {user} v{self.versions[user]}"
        await stream.next_update()
        version = await self.read(user)
        assert version == self.versions[user], f"{user} read v{version} after the update for v{self.versions[user]}"
        self.seen[user] = version

    async def apply(self, steps: list[Action]) -> None:
        for kind, user in steps:
            if kind == "read":
                await self.check_read(user)
            elif kind == "bump":
                await self.bump(user)
            else:
                await asyncio.gather(*(self.check_read(name) for name in USERS))


@pytest.fixture(scope="module")
def profile_world() -> Iterator[ProfileWorld]:
    with loop_thread("profile-world") as thread:
        yield from _profile_world(ProfileWorld(thread=thread))


def _profile_world(world: ProfileWorld) -> Iterator[ProfileWorld]:
    stack: list[Any] = []

    async def setup() -> None:
        up_cm = await start_upstream("modern", read_ttl_ms=600_000)
        world.up = await up_cm.__aenter__()
        stack.append(up_cm)
        polling = {"min_interval_ms": 50, "default_interval_ms": 150, "max_interval_ms": 150, "linger_ms": 100}
        sidecar_cm = serve_sidecar(world.up.url, polling=polling)
        world.sidecar = await sidecar_cm.__aenter__()
        stack.append(sidecar_cm)
        world.http = aiohttp.ClientSession()
        for user in USERS:
            world.streams[user] = await ListenStream.connect(
                world.http, world.sidecar.url, f"listen-{user}", [PROFILE], authorization=f"Bearer {user}"
            )

    async def teardown() -> None:
        for stream in world.streams.values():
            await stream.close()
        if world.http is not None:
            await world.http.close()
        for cm in reversed(stack):
            await cm.__aexit__(None, None, None)

    try:
        world.run(setup)
        yield world
    finally:
        world.run(teardown)


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=actions)
def test_a_private_result_reaches_only_its_own_context_and_is_fresh_after_its_update(
    profile_world: ProfileWorld, steps: list[Action]
) -> None:
    profile_world.run(lambda: profile_world.apply(steps))
