"""Replicas behind partitions: each replica reaches Redis and the upstream through a `PartitionProxy` of its own, so a
test can cut one replica from one of them (every byte held both ways, no RST) and heal it again; a Service that
sends each new connection to a ready replica, as a Kubernetes Service does; and the partition campaign: clients
that listen and re-read through the Service while the source changes and the cuts come and go, their history
checked for changes lost, reads gone stale, and changes read late.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp

from sidecar.observability.logs import INSTANCE_ENV
from tests.cluster import RedisServer, Replica, free_port, sidecar_config
from tests.kit import ListenStream, rpc
from tests.kit.partition_proxy import PartitionProxy, partition_proxy
from tests.kit.wire import UPDATED
from tests.peers import Upstream

__all__ = [
    "LEASE_MS",
    "UPSTREAM_TIMEOUT_S",
    "URI",
    "Campaign",
    "Cut",
    "Fleet",
    "Kind",
    "Member",
    "Service",
    "Verdict",
    "partitioned_fleet",
]

URI = "catalog://price"
LEASE_MS = 900
UPSTREAM_TIMEOUT_S = 2.0
"""`upstream.timeout_s`: a read the upstream does not answer this soon is a failure. A cut that holds every byte
is noticed only by it, so the replicas here wait 2 s, not the default 30 s."""


@dataclass
class Member:
    """One replica and its two links, each of which can be cut."""

    replica: Replica
    upstream: PartitionProxy
    redis: PartitionProxy

    @property
    def name(self) -> str:
        return self.replica.name


@dataclass
class Fleet:
    members: list[Member]

    @property
    def replicas(self) -> list[Replica]:
        return [member.replica for member in self.members]


@contextlib.asynccontextmanager
async def partitioned_fleet(
    tmp_path: Path,
    shop: Upstream,
    redis: RedisServer,
    count: int = 2,
    *,
    instances: Sequence[str] | None = None,
    **sections: Any,
) -> AsyncIterator[Fleet]:
    """`count` replicas on the Redis bus (lease 900 ms, polling at the upstream's ttlMs), each reaching Redis and
    the upstream through proxies of its own; all ready inside the block, all stopped after."""
    async with contextlib.AsyncExitStack() as stack:
        members = []
        for n in range(count):
            name = f"replica-{n}"
            up = await stack.enter_async_context(partition_proxy(shop.port, f"{name} to the upstream"))
            bus = await stack.enter_async_context(partition_proxy(redis.port, f"{name} to Redis"))
            config = sidecar_config(
                f"http://127.0.0.1:{up.port}/mcp",
                free_port(),
                f"redis://127.0.0.1:{bus.port}/0",
                **{"upstream": {"timeout_s": UPSTREAM_TIMEOUT_S}, **sections},
            )
            config["bus"]["lease_ms"] = LEASE_MS
            env = {INSTANCE_ENV: instances[n]} if instances else None
            members.append(Member(Replica(name, tmp_path / name, config, env=env), up, bus))
        try:
            await asyncio.gather(*(member.replica.start() for member in members))
            yield Fleet(members)
        finally:
            for member in members:  # let every byte flow, so each replica can stop as it would
                member.upstream.release()
                member.redis.release()
            await asyncio.gather(*(member.replica.service.stop() for member in members))


# -- the Service ------------------------------------------------------------------------------------------------------

_PROBE_S = 0.5
_PROBE_TIMEOUT = aiohttp.ClientTimeout(total=1.0)


class Service:
    """New connections go to ready replicas, in turn, as through a Kubernetes Service: each replica's /readyz is
    asked every half second (a probe that takes over a second fails); one failed probe takes it out of the
    endpoints, one passing puts it back. With no replica ready, any replica is picked."""

    def __init__(self, http: aiohttp.ClientSession, replicas: Sequence[Replica]) -> None:
        self._http = http
        self._replicas = list(replicas)
        self.ready: set[str] = {replica.name for replica in replicas}
        self._turn = itertools.count()
        self._task: asyncio.Task[None] | None = None

    def pick(self) -> Replica:
        ready = [replica for replica in self._replicas if replica.name in self.ready] or self._replicas
        return ready[next(self._turn) % len(ready)]

    async def _probe(self, replica: Replica) -> None:
        try:
            async with self._http.get(replica.base_url + "/readyz", timeout=_PROBE_TIMEOUT) as resp:
                ready = resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ready = False
        (self.ready.add if ready else self.ready.discard)(replica.name)

    async def _run(self) -> None:
        while True:
            await asyncio.gather(*(self._probe(replica) for replica in self._replicas))
            await asyncio.sleep(_PROBE_S)  # the probe period, as a Deployment's readinessProbe sets it

    async def __aenter__(self) -> Service:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


# -- the campaign -----------------------------------------------------------------------------------------------------

Kind = Literal["upstream", "redis"]


@dataclass(frozen=True)
class Cut:
    """`member`'s link to `kind` held for `seconds`, then `heal_s` of calm before the next cut."""

    member: int
    kind: Kind
    seconds: float
    heal_s: float = 5.0


@dataclass
class Read:
    client: str
    replica: str
    started: float
    answered: float
    value: int


@dataclass
class Window:
    label: str
    start: float
    end: float


@dataclass
class Verdict:
    """What the history says: changes never read, reads older than one the client had already read, values the
    source never held, clients not at the final value, and for each cut the longest time from a change to a
    client's fresh read of it (a change made during the cut or within `AFTER_S` of its healing)."""

    lost: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    stale_at_end: list[str] = field(default_factory=list)
    late: list[str] = field(default_factory=list)
    longest: dict[str, float] = field(default_factory=dict)
    moved: int = 0
    """Listen streams ended with the sidecar's retryable reason (their clients listened again)."""

    def summary(self) -> str:
        figures = ", ".join(f"{label}: {seconds:.2f} s" for label, seconds in self.longest.items())
        return (
            f"longest change->fresh read: {figures}; streams moved: {self.moved}; lost {len(self.lost)}, stale "
            f"{len(self.stale)}, foreign {len(self.foreign)}, stale at the end {len(self.stale_at_end)}, late "
            f"{len(self.late)}"
        )


AFTER_S = 6.0
_READ_TIMEOUT = aiohttp.ClientTimeout(total=5.0)
_RETRY_READ_S = 0.5
_RELISTEN_S = 0.1
MOVED_META = "io.github.mcp-sidecar/ended"


class Campaign:
    """`clients` listen to URI through `service` and re-read it (on the replica they listen on) after every ack and
    every notification, retrying a failed read; a stream that ends is listened again through the service. The
    source changes every `change_every_s`; `cuts` are applied one after the other."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        shop: Upstream,
        fleet: Fleet,
        service: Service,
        *,
        clients: int = 8,
        change_every_s: float = 0.15,
    ) -> None:
        self._http = http
        self._shop = shop
        self._fleet = fleet
        self._service = service
        self._clients = clients
        self._change_every_s = change_every_s
        self.changes: list[tuple[float, int]] = []
        self.reads: list[Read] = []
        self.windows: list[Window] = []
        self.foreign: list[str] = []
        self.moved = 0
        self.journal: list[tuple[float, str, str]] = []
        """(when, client, what happened to its stream): what a failure message quotes."""
        self._stop = asyncio.Event()
        self._source_stop = asyncio.Event()
        """The source makes no more changes: set, never a cancellation (a change cut off half-way may have reached
        the source without being recorded, and the clients would read a value it seems never to have held)."""

    # -- the source and the clients ---------------------------------------------------------------------------------

    async def _change_source(self) -> None:
        value = 1000
        while not self._source_stop.is_set():
            value += 1
            sent = time.monotonic()
            await self._shop.set_price(value)
            self.changes.append((sent, value))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._source_stop.wait(), self._change_every_s)  # the pace, or the stop

    async def _read(self, client: str, replica: Replica) -> bool:
        started = time.monotonic()
        try:
            status, message = await asyncio.wait_for(
                rpc(self._http, replica.url, "resources/read", {"uri": URI}), _READ_TIMEOUT.total
            )
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False
        if status != 200 or "result" not in message:
            return False
        text = message["result"]["contents"][0]["text"]
        value = int(text.removeprefix("price="))
        self.reads.append(Read(client, replica.name, started, time.monotonic(), value))
        return True

    async def _reader(self, client: str, replica: Replica, wanted: asyncio.Event) -> None:
        """The client's reads on `replica`: one after each ack or notification (those that come during a read make
        one more after it), each tried again until answered. Cancelled when its stream ends: a real client's
        stream reader does not wait for its reads."""
        while True:
            await wanted.wait()
            wanted.clear()
            for _ in itertools.count():
                if await self._read(client, replica):
                    break
                await asyncio.sleep(_RETRY_READ_S)  # a client's pause before it tries a failed read again

    async def _client(self, name: str) -> None:
        for n in itertools.count():
            if self._stop.is_set():
                return
            replica = self._service.pick()
            stream = ListenStream(self._http, replica.url, f"{name}-{n}", [URI])
            try:
                try:
                    await stream.open(within_s=10.0)
                except (AssertionError, aiohttp.ClientError, TimeoutError) as exc:
                    self._note(name, f"listen on {replica.name} failed: {str(exc)[:80]}")
                    await asyncio.sleep(_RELISTEN_S)  # refused (or not answered): listen again, elsewhere
                    continue
                self._note(name, f"listening on {replica.name}")
                wanted = asyncio.Event()
                wanted.set()  # the read after the ack
                reading = asyncio.get_running_loop().create_task(self._reader(name, replica, wanted))
                try:
                    await self._follow(name, replica, stream, wanted)
                finally:
                    reading.cancel()
            finally:
                await stream.close()

    async def _follow(self, name: str, replica: Replica, stream: ListenStream, wanted: asyncio.Event) -> None:
        while not self._stop.is_set():
            try:
                frame = await stream.next(within_s=1.0)
            except AssertionError:
                if stream.ended:
                    self._note(name, f"stream on {replica.name} cut off")
                    return
                continue  # quiet for a second: look at the stop flag
            if frame.get("method") == UPDATED:
                if frame["params"]["uri"] != URI:
                    self.foreign.append(f"{stream.label}: {frame}")
                    continue
                wanted.set()
            elif "result" in frame:
                if MOVED_META in frame["result"].get("_meta", {}):
                    self.moved += 1
                self._note(name, f"stream on {replica.name} ended: {frame['result'].get('_meta')}")
                return
            else:
                self.foreign.append(f"{stream.label}: {frame}")

    def _note(self, client: str, what: str) -> None:
        self.journal.append((time.monotonic(), client, what))

    # -- the cuts ---------------------------------------------------------------------------------------------------

    async def _cut(self, cut: Cut) -> None:
        member = self._fleet.members[cut.member]
        proxy = member.upstream if cut.kind == "upstream" else member.redis
        label = f"{member.name} cut from {'the upstream' if cut.kind == 'upstream' else 'Redis'}"
        start = time.monotonic()
        proxy.hold()
        try:
            await asyncio.sleep(cut.seconds)  # the scenario: how long the partition lasts
        finally:
            proxy.release()
        self.windows.append(Window(label, start, time.monotonic() + AFTER_S))
        await asyncio.sleep(cut.heal_s)  # the calm between two cuts

    async def run(self, cuts: Sequence[Cut], *, settle_s: float = 3.0, end_s: float = 8.0) -> Verdict:
        """The clients and the source run through `settle_s` of calm, every cut, and `end_s` more with the source
        still; then the history is checked."""
        clients = [asyncio.get_running_loop().create_task(self._client(f"client-{n}")) for n in range(self._clients)]
        source = asyncio.get_running_loop().create_task(self._change_source())
        try:
            await asyncio.sleep(settle_s)  # the clients listen and the fleet settles
            for cut in cuts:
                await self._cut(cut)
            self._source_stop.set()
            await source
            await asyncio.sleep(end_s)  # every client reads the last change
        finally:
            self._stop.set()
            self._source_stop.set()
            source.cancel()
            for task in clients:
                task.cancel()
            await asyncio.gather(source, *clients, return_exceptions=True)
        return self.verdict()

    # -- the check --------------------------------------------------------------------------------------------------

    def _window_of(self, sent: float) -> str:
        """The cut a change belongs to: one made within a second before a cut began, during it, or within AFTER_S of
        its healing; else "no cut"."""
        for window in self.windows:
            if window.start - 1.0 <= sent <= window.end:
                return window.label
        return "no cut"

    def verdict(self, late_s: float = 6.0) -> Verdict:
        verdict = Verdict(foreign=list(self.foreign), moved=self.moved)
        held = {value for _, value in self.changes} | {100}
        by_client: dict[str, list[Read]] = {}
        for read in self.reads:
            by_client.setdefault(read.client, []).append(read)
            if read.value not in held:
                verdict.foreign.append(f"{read.client} read {read.value}, never held at the source")
        final = self.changes[-1][1] if self.changes else None
        for n in range(self._clients):
            if f"client-{n}" not in by_client:
                verdict.lost.append(f"client-{n} read nothing")
        worst: dict[str, str] = {}
        for client, reads in sorted(by_client.items()):
            reads.sort(key=lambda read: read.answered)
            newest: Read | None = None
            for read in reads:
                if newest is not None and read.started > newest.answered and read.value < newest.value:
                    verdict.stale.append(
                        f"{client} read {read.value} on {read.replica} after reading {newest.value} on {newest.replica}"
                    )
                if newest is None or read.value > newest.value:
                    newest = read
            if reads[-1].value != final:
                verdict.stale_at_end.append(f"{client} last read {reads[-1].value}, the source holds {final}")
            for sent, value in self.changes:
                fresh = next((read for read in reads if read.answered >= sent and read.value >= value), None)
                if fresh is None:
                    verdict.lost.append(f"{client} never read {value} or later")
                    continue
                lateness = fresh.answered - sent
                label = self._window_of(sent)
                if lateness > verdict.longest.get(label, -1.0):
                    verdict.longest[label] = lateness
                    journal = [f"{at - sent:+.2f} s {what}" for at, c, what in self.journal if c == client]
                    worst[label] = f"{client} read {value} on {fresh.replica} ({'; '.join(journal[-6:])})"
        for label, seconds in verdict.longest.items():
            if seconds > late_s:
                verdict.late.append(f"{label}: {worst[label]} {seconds:.2f} s after it was made")
        return verdict
