"""The listen hub's world for its unit tests: a real `StreamHub` over a real `WatchRegistry` on the in-memory bus and
the hand-moved clock (`tests/unit/watch/registry_world.py`), reading a scripted upstream; each stream's connection is
a `Client` that records what its client would read, with no socket (the integration tests have the sockets)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import orjson

from sidecar.changes import ChangeEvent, WatchKey
from sidecar.config.sections import StreamsConfig
from sidecar.downstream.event_stream import StreamStalled
from sidecar.downstream.listen import StreamHub
from sidecar.identity import ANONYMOUS_IDENTITY, Identity
from sidecar.protocol.envelope import Message, parse_message
from sidecar.upstream.answers import UpstreamInfo
from tests.kit import WAIT_S, listen_request
from tests.unit.watch.registry_world import World, make_world
from tests.unit.watch.scripted_upstream import URL

__all__ = ["ALL_KINDS", "Client", "Era", "HubWorld", "Listening", "close_hub", "make_hub"]

ALL_KINDS = {"resources": {}, "tools": {}, "prompts": {}}
"""An upstream's capabilities with every kind the hub can watch."""


class Era:
    """The upstream's era and capabilities, as the hub asks for them (as whom it was asked is recorded)."""

    def __init__(self, capabilities: dict[str, Any]) -> None:
        self.info = UpstreamInfo("modern", capabilities, None, None)
        self.asked: list[Identity] = []
        self.remembered = False
        """The upstream cannot be reached: `discovery` answers with what it remembers."""
        self.back = asyncio.Event()
        """Set while the upstream can be used (`reached` waits for it)."""
        self.back.set()

    @property
    def url(self) -> str:
        return URL

    async def ensure_info(self, identity: Identity = ANONYMOUS_IDENTITY) -> UpstreamInfo:
        self.asked.append(identity)
        return self.info

    async def discovery(self, identity: Identity = ANONYMOUS_IDENTITY) -> tuple[UpstreamInfo, bool]:
        return await self.ensure_info(identity), self.remembered

    async def reached(self) -> UpstreamInfo:
        await self.back.wait()
        return self.info

    def outage(self) -> None:
        """The upstream cannot be reached: discovery is remembered, and `reached` waits."""
        self.remembered = True
        self.back.clear()

    def recovered(self) -> None:
        self.remembered = False
        self.back.set()


class Client:
    """One listen stream's connection as its client reads it: the frames in order (events as their JSON, comments as
    `b":"`), a send buffer with room for `room` frames until the client reads, and a client that may go away."""

    def __init__(self, room: int = 1_000) -> None:
        self.room = room
        self.connected = True
        self.quiet = True
        self.opened = False
        self.closed = False
        self.stalls = False
        """Past a full buffer, `drain` gives up as a stalled client's does (`stall_timeout_s` passed)."""
        self.gone_before_open = False
        self.drains = 0
        """Times the stream's driver waited for the client to read (its buffer full, signals pending)."""
        self.frames: list[bytes] = []
        self._changed = asyncio.Event()
        self._read = asyncio.Event()

    @property
    def writable(self) -> bool:
        return self.connected and self.room > 0

    async def open(self) -> None:
        if self.gone_before_open:
            raise ConnectionResetError("the client went away")
        self.opened = True

    def write_event(self, data: bytes) -> None:
        self._write(data)

    def write_comment(self) -> None:
        self._write(b":")

    def _write(self, frame: bytes) -> None:
        assert self.opened and self.connected, "nothing is written before the headers or after the client left"
        self.quiet = False
        self.room -= 1
        self.frames.append(frame)
        self._changed.set()

    async def drain(self) -> None:
        while not self.writable and self.connected:
            if self.stalls:
                raise StreamStalled
            self.drains += 1
            self._changed.set()
            self._read.clear()
            await self._read.wait()

    async def close(self) -> None:
        self.closed = True
        self._changed.set()

    def read(self, frames: int) -> None:
        """The client reads: `frames` more fit in the send buffer."""
        self.room += frames
        self._read.set()

    def leave(self) -> None:
        """The connection drops (the driver learns it at its next write or wait)."""
        self.connected = False
        self._read.set()

    def messages(self) -> list[dict[str, Any]]:
        return [orjson.loads(frame) for frame in self.frames if frame != b":"]

    def updates(self) -> list[str | None]:
        """The URIs (None for a list) of the change notifications read, in order."""
        return [m["params"].get("uri") for m in self.messages()[1:] if m.get("method", "").startswith("notifications/")]

    async def until(self, predicate: Callable[[], bool], what: str) -> None:
        """Until `predicate` holds, woken by each write or the close; AssertionError naming `what` after the kit's
        bounded wait."""
        try:
            async with asyncio.timeout(WAIT_S):
                while not predicate():
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"not within {WAIT_S} s: {what}; read {self.messages()}") from None


@dataclass
class Listening:
    """A listen in progress: its handler's task, its request and what its client reads."""

    task: asyncio.Task[None]
    message: Message
    client: Client

    async def acked(self) -> dict[str, Any]:
        """The first frame, once written (the handler's error, if it answered with one)."""
        ack_or_end = asyncio.ensure_future(self.client.until(lambda: bool(self.client.frames), "the ack"))
        await asyncio.wait({ack_or_end, self.task}, return_when=asyncio.FIRST_COMPLETED)
        if not ack_or_end.done():
            ack_or_end.cancel()
            self.task.result()  # raises what the listen was answered with
            raise AssertionError("the listen ended without an ack")
        ack_or_end.result()
        return self.client.messages()[0]

    async def ended(self) -> None:
        await asyncio.wait_for(asyncio.shield(self.task), WAIT_S)


@dataclass
class HubWorld:
    world: World
    era: Era
    hub: StreamHub
    listens: list[Listening]

    def listen(
        self,
        uris: list[str] | None = None,
        request_id: Any = 1,
        identity: Identity = ANONYMOUS_IDENTITY,
        client: Client | None = None,
        **lists: bool,
    ) -> Listening:
        message = parse_message(orjson.dumps(listen_request(uris or [], request_id, **lists)))
        client = client or Client()
        task = asyncio.ensure_future(self.hub.listen(message, identity, client))
        listening = Listening(task, message, client)
        self.listens.append(listening)
        return listening

    def key(self, uri: str | None, kind: str = "resource") -> WatchKey:
        """The one watch's key of `uri` (or of the list `kind`)."""
        (key,) = [w.key for w in self.world.registry.watches() if w.key.uri == uri and w.key.kind == kind]
        return key

    def publish(self, key: WatchKey, *, baseline: bool = False) -> None:
        """A change (or another replica's first look) of `key`, heard on the bus."""
        self.world.bus.deliver(ChangeEvent(key, f"fp-{len(self.world.events)}", 2, 0.0, baseline=baseline))

    def gauge(self, name: str, **labels: str) -> float:
        return self.world.gauge(name, **labels) or 0.0


def make_hub(capabilities: dict[str, Any] | None = None, **config: Any) -> HubWorld:
    """A hub over a fresh registry's world, with the streams' configuration `config`."""
    world = make_world()
    era = Era(ALL_KINDS if capabilities is None else capabilities)
    streams = StreamsConfig(**config)
    return HubWorld(
        world, era, StreamHub(world.registry, cast(Any, era), world.bus, streams, world.metrics, world.clock), []
    )


async def close_hub(hub: HubWorld) -> None:
    """What the app's shutdown does, then every handler's end awaited."""
    await hub.hub.close_all()
    for listening in hub.listens:
        listening.task.cancel()
    await asyncio.gather(*(listening.task for listening in hub.listens), return_exceptions=True)
    await hub.hub.aclose()
    await hub.world.registry.aclose()
