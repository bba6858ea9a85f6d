"""What the read-through cache's unit tests share: a hand-moved clock, a forward that answers as the upstream
would, and the cache's metrics read back as a client's operator sees them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from sidecar.config.sections import CacheConfig
from sidecar.downstream.readthrough import ReadThrough
from sidecar.observability.metrics import Metrics
from sidecar.protocol.types import JsonObject
from sidecar.upstream.answers import Reply

READ = "resources/read"


class Clock:
    """Monotonic seconds that move only when a test moves them."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def cache(clock: Clock | None = None, **config: Any) -> tuple[ReadThrough, Metrics]:
    metrics = Metrics()
    return ReadThrough(CacheConfig(**config), metrics, clock or Clock()), metrics


def sample(metrics: Metrics, name: str) -> float:
    return metrics.registry.get_sample_value(name) or 0.0


def result(text: str = "v1", ttl: object = 60_000, scope: str = "private", **extra: Any) -> JsonObject:
    return {"contents": [{"uri": "x://a", "text": text}], "ttlMs": ttl, "cacheScope": scope, **extra}


def answering(
    answer: JsonObject | None = None, *, status: int = 200, bound: bool = True
) -> Callable[[Callable[[], None]], Any]:
    """A forward that holds its upstream slot (`bound`) and answers `answer` as a whole JSON message."""

    async def forward(started: Callable[[], None]) -> Reply:
        if bound:
            started()
        return Reply(status, message=answer)

    return forward


def ok(res: JsonObject) -> JsonObject:
    return {"jsonrpc": "2.0", "id": 1, "result": res}


async def store(
    rt: ReadThrough,
    res: JsonObject,
    *,
    method: str = READ,
    params: JsonObject | None = None,
    context: str = "alice",
    ticket: int = 0,
) -> None:
    """A request that went upstream and came back with `res`."""
    reply, shared = await rt.fetch(
        method, {"uri": "x://a"} if params is None else params, context, answering(ok(res)), ticket
    )
    assert reply is not None and shared is None


class Gate:
    """A forward held open until the test lets it answer: a request in flight upstream."""

    def __init__(self, answer: JsonObject | None, *, bound: bool = True) -> None:
        self.answer = answer
        self.bound = bound
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.started: Callable[[], None] | None = None

    async def __call__(self, started: Callable[[], None]) -> Reply:
        self.started = started
        if self.bound:
            started()
        self.entered.set()
        await self.release.wait()
        return Reply(200, message=self.answer)
