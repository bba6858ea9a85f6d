"""Real Redis for the tests: one `redis-server`, or a Redis Cluster of six (three masters, a replica each), each
node a `tests.procs.ServerProcess` on 127.0.0.1 in a temp dir of the test, stopped when its block is left.

    async with redis_server(tmp_path) as redis: ...          # redis.url, redis.stop(), redis.start() (same port)
    async with redis_cluster(tmp_path) as nodes: ...         # nodes.url, nodes.kill_master(port), nodes.reshard(...)
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import redis.asyncio as aioredis

from tests import prereqs
from tests.kit import eventually
from tests.procs import START_TIMEOUT_S, ServerProcess, free_port, redis_answers, redis_argv

__all__ = [
    "CLUSTER_NODE_TIMEOUT_MS",
    "RedisClusterNodes",
    "RedisServer",
    "redis_cluster",
    "redis_server",
    "require_binary",
]


def require_binary(name: str) -> str:
    """The path of `name` (PATH or sbin); skips the test when absent (a failure under CI: `tests.prereqs`)."""
    return prereqs.require_binary(name, needed_by="the scale-out tests")


# -- redis-server ---------------------------------------------------------------------------------------------------


class RedisServer:
    """`redis-server` in the foreground, no persistence; `stop` then `start` restarts it on the same port, empty."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.binary = require_binary("redis-server")
        self.port = port or free_port()
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.service: ServerProcess | None = None
        self._starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def ping(self) -> bool:
        return await redis_answers(self.port)()

    async def subscribers(self, channel: str) -> int:
        """How many clients are subscribed to `channel` (PUBSUB NUMSUB)."""
        async with aioredis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2.0) as client:
            [(_, count)] = await client.pubsub_numsub(channel)
            return int(count)

    async def start(self) -> None:
        self._starts += 1
        argv = redis_argv(self.binary, self.port, self.workdir)
        self.service = ServerProcess(f"redis-server:{self.port}", argv, self.workdir / f"redis-{self._starts}.log")
        await self.service.start(redis_answers(self.port), START_TIMEOUT_S)

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.stop()


@contextlib.asynccontextmanager
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    redis = RedisServer(tmp_path / "redis")
    try:
        await redis.start()
        yield redis
    finally:
        await redis.stop()


# -- a Redis Cluster: three masters with a replica each --------------------------------------------------------------

CLUSTER_NODE_TIMEOUT_MS = 1000
"""A dead master's replica is promoted about this long after the others stop hearing it."""


class RedisClusterNodes:
    """Six `redis-server --cluster-enabled yes` processes joined by `redis-cli --cluster create`: three masters,
    one replica each. `kill_master` kills one (-9) and waits for its replica's promotion; `reshard` moves slots
    (with their keys) between masters as `redis-cli --cluster reshard` does."""

    def __init__(self, workdir: Path, masters: int = 3) -> None:
        self.binary = require_binary("redis-server")
        self.cli = prereqs.require_binary("redis-cli", package="redis-tools", needed_by="the Redis Cluster tests")
        self.workdir = workdir
        self.ports = [_cluster_port() for _ in range(masters * 2)]
        self.masters_count = masters
        self.services: dict[int, ServerProcess] = {}

    @property
    def url(self) -> str:
        seeds = ",".join(f"127.0.0.1:{port}" for port in self.ports[: self.masters_count])
        return f"redis+cluster://{seeds}"

    async def start(self) -> None:
        for port in self.ports:
            home = self.workdir / str(port)
            home.mkdir(parents=True, exist_ok=True)
            argv = [
                *redis_argv(self.binary, port, home),
                *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
                *("--cluster-node-timeout", str(CLUSTER_NODE_TIMEOUT_MS)),
                # A replica syncs at once and may be promoted however long ago it last heard its master.
                *("--repl-diskless-sync-delay", "0", "--cluster-replica-validity-factor", "0"),
            ]
            service = ServerProcess(f"redis-cluster:{port}", argv, home / "redis.log")
            self.services[port] = service
        await asyncio.gather(*(s.start(redis_answers(p), START_TIMEOUT_S) for p, s in self.services.items()))
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        await self._cli("--cluster", "create", *nodes, "--cluster-replicas", "1", "--cluster-yes")
        await eventually(self._all_ok, START_TIMEOUT_S, what="every node reports cluster_state:ok and knows all six")
        await eventually(self._replicas_synced, START_TIMEOUT_S, what="every replica has synced with its master")

    async def _cli(self, *args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            self.cli, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await proc.communicate()
        text = out.decode(errors="replace")
        assert proc.returncode == 0, f"redis-cli {' '.join(args)} failed:\n{text[-2000:]}"
        return text

    async def _client(self, port: int) -> aioredis.Redis:
        return aioredis.Redis(host="127.0.0.1", port=port, socket_timeout=2.0)

    async def _all_ok(self) -> bool:
        for port, service in self.services.items():
            if not service.running:
                continue
            try:
                async with await self._client(port) as client:
                    info = await client.execute_command("CLUSTER", "INFO")
                    text = info.decode() if isinstance(info, bytes) else str(info)
                    if "cluster_state:ok" not in text or f"cluster_known_nodes:{len(self.ports)}" not in text:
                        return False
            except (OSError, aioredis.RedisError):
                return False
        return True

    async def _replicas_synced(self) -> bool:
        synced = 0
        for port in self.ports:
            async with await self._client(port) as client:
                info = await client.info("replication")
            synced += info.get("role") == "slave" and info.get("master_link_status") == "up"
        return synced == len(self.ports) - self.masters_count

    async def masters(self) -> list[tuple[str, int, int]]:
        """(node id, port, slots held) of every live master."""
        port = self._live_port()
        async with await self._client(port) as client:
            raw = await client.execute_command("CLUSTER", "NODES")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        found = []
        for line in text.splitlines():
            fields = line.split()
            if "master" in fields[2] and "fail" not in fields[2]:
                found.append((fields[0], int(fields[1].split(":")[1].split("@")[0]), _slot_count(fields[8:])))
        return found

    def _live_port(self) -> int:
        for port, service in self.services.items():
            if service.running:
                return port
        raise AssertionError("no cluster node is running")

    async def kill_master(self, port: int) -> None:
        """kill -9 the master on `port`; returns once its replica serves its slots (cluster_state:ok again)."""
        await self.services[port].kill()

        async def promoted() -> bool:
            masters = await self.masters()
            return len(masters) == self.masters_count and all(p != port for _, p, _ in masters) and await self._ok()

        await eventually(promoted, 30, what=f"the replica of {port} is promoted")

    async def _ok(self) -> bool:
        for port, service in self.services.items():
            if service.running:
                async with await self._client(port) as client:
                    info = await client.execute_command("CLUSTER", "INFO")
                    text = info.decode() if isinstance(info, bytes) else str(info)
                    if "cluster_state:ok" not in text:
                        return False
        return True

    async def reshard(self, source: str, target: str, slots: int) -> None:
        """Move `slots` slots and their keys from master `source` to master `target` (node ids)."""
        port = self._live_port()
        await self._cli("--cluster", "reshard", f"127.0.0.1:{port}", "--cluster-from", source,
                        "--cluster-to", target, "--cluster-slots", str(slots), "--cluster-yes")  # fmt: skip

    async def stop(self) -> None:
        await asyncio.gather(*(service.stop() for service in self.services.values()))


def _cluster_port() -> int:
    """A free port whose cluster bus port (10,000 higher) is free too, so at most 55,535."""
    while True:
        port = free_port()
        if port <= 55_535 and _bindable(port + 10_000):
            return port


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _slot_count(ranges: Sequence[str]) -> int:
    count = 0
    for item in ranges:
        if item.startswith("["):
            continue  # a slot being migrated or imported
        first, _, last = item.partition("-")
        count += int(last or first) - int(first) + 1
    return count


@contextlib.asynccontextmanager
async def redis_cluster(tmp_path: Path) -> AsyncIterator[RedisClusterNodes]:
    nodes = RedisClusterNodes(tmp_path / "redis-cluster")
    try:
        await nodes.start()
        yield nodes
    finally:
        await nodes.stop()
