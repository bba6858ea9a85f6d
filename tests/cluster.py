"""Real services for the scale-out tests: redis-server, nginx and sidecar replicas, each a process on 127.0.0.1.

Every service is a `tests.procs.ServerProcess`: in the foreground of its own subprocess, in a temp dir of the
test, with its output in a log file there (shown when it fails to start), and stopped when its block is left:
SIGTERM, SIGKILL after a bound.

    async with redis_server(tmp_path) as redis, sidecar_replicas(tmp_path, up.url, redis.url, 3) as replicas,
               nginx_proxy(tmp_path, [r.port for r in replicas]) as lb:
        ...

`require_binary` skips the calling test (with the reason) when redis-server or nginx is not installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import redis.asyncio as aioredis
import yaml

from sidecar.bus.layout import key_hash
from sidecar.bus.ownership import rendezvous_owner
from sidecar.changes import WatchKey
from sidecar.observability.logs import INSTANCE_ENV
from tests import prereqs
from tests.kit import Scrape, eventually, parse
from tests.procs import (
    START_TIMEOUT_S,
    OnLoopback,
    ServerProcess,
    free_port,
    http_answers,
    nginx_argv,
    nginx_preamble,
    redis_answers,
    redis_argv,
)

__all__ = [
    "FAST_POLLING",
    "LEASE_MS",
    "Nginx",
    "RedisClusterNodes",
    "RedisServer",
    "Replica",
    "free_port",
    "instances_where_first_polls",
    "leases_held",
    "nginx_proxy",
    "redis_cluster",
    "redis_server",
    "require_binary",
    "sidecar_config",
    "sidecar_replicas",
    "write_config",
]

_PROBE_TIMEOUT = aiohttp.ClientTimeout(total=2.0)

LEASE_MS = 900
"""Short leases: a dead owner's key is taken over within about a second."""
FAST_POLLING = {
    "min_interval_ms": 100,
    "default_interval_ms": 300,
    "backoff_initial_ms": 100,
    "backoff_max_ms": 500,
}


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


# -- sidecar replicas -----------------------------------------------------------------------------------------------


def sidecar_config(upstream_url: str, port: int, redis_url: str | None = None, **sections: Any) -> dict[str, Any]:
    """A run config: fixed port, fast polling, 1 s keep-alives, JSON logs, and the Redis bus when `redis_url`."""
    data: dict[str, Any] = {
        "upstream": {"url": upstream_url},
        "listen": {"host": "127.0.0.1", "port": port, "shutdown_grace_s": 2},
        "polling": dict(FAST_POLLING),
        "streams": {"keepalive_s": 1},
        "logging": {"format": "json", "level": "info"},
    }
    if redis_url is not None:
        data["bus"] = {"backend": "redis", "redis_url": redis_url, "lease_ms": LEASE_MS}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return data


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


class Replica(OnLoopback):
    """One `python -m sidecar.cli run --config FILE` process on a fixed port (or a `--workers N` process tree)."""

    def __init__(
        self,
        name: str,
        workdir: Path,
        config: dict[str, Any],
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.port: int = config["listen"]["port"]
        config = {**config, "admin": {"host": "127.0.0.1", "port": free_port(), **config.get("admin", {})}}
        self.admin_port: int = config["admin"]["port"]
        self.config_path = write_config(workdir / "sidecar.yaml", config)
        argv = [sys.executable, "-m", "sidecar.cli", "run", "--config", str(self.config_path), *extra_args]
        self.service = ServerProcess(name, argv, workdir / "sidecar.log", env=env)

    async def _get(self, path: str, *, admin: bool = False) -> tuple[int, str]:
        # A fresh connection each time: with --workers the kernel picks a worker per connection.
        connector = aiohttp.TCPConnector(force_close=True)
        base = f"http://127.0.0.1:{self.admin_port}" if admin else self.base_url
        async with (
            aiohttp.ClientSession(connector=connector, timeout=_PROBE_TIMEOUT) as http,
            http.get(base + path) as resp,
        ):
            return resp.status, await resp.text()

    async def readyz(self) -> tuple[int, dict[str, Any]]:
        status, text = await self._get("/readyz")
        return status, orjson.loads(text)

    async def status(self) -> dict[str, Any]:
        status, text = await self._get("/status", admin=True)
        assert status == 200, text
        body: dict[str, Any] = orjson.loads(text)
        return body

    async def metrics(self) -> Scrape:
        """The admin listener's `/metrics`; ask it `total(...)` (a sum over label values, 0 when absent)."""
        status, text = await self._get("/metrics", admin=True)
        assert status == 200, text
        return parse(text)

    async def is_ready(self) -> bool:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            return (await self.readyz())[0] == 200
        return False

    async def start(self) -> None:
        await self.service.start(self.is_ready, START_TIMEOUT_S)

    def log_lines(self) -> list[dict[str, Any]]:
        """The JSON log lines written so far (other lines, e.g. a traceback, are skipped)."""
        lines = []
        for line in self.service.log_text().splitlines():
            with contextlib.suppress(ValueError):
                entry = orjson.loads(line)
                if isinstance(entry, dict):
                    lines.append(entry)
        return lines


@contextlib.asynccontextmanager
async def sidecar_replicas(
    tmp_path: Path,
    upstream_url: str,
    redis_url: str,
    count: int,
    *,
    instances: Sequence[str] | None = None,
    **sections: Any,
) -> AsyncIterator[list[Replica]]:
    """`count` replicas on the Redis bus, each on its own fixed port, all ready (and all stopped on exit);
    `instances` names them (MCP_SIDECAR_INSTANCE), so a test can tell which one rendezvous hashing picks."""
    replicas = [
        Replica(
            f"replica-{n}",
            tmp_path / f"replica-{n}",
            sidecar_config(upstream_url, free_port(), redis_url, **sections),
            env={INSTANCE_ENV: instances[n]} if instances else None,
        )
        for n in range(count)
    ]
    try:
        await asyncio.gather(*(replica.start() for replica in replicas))
        yield replicas
    finally:
        await asyncio.gather(*(replica.service.stop() for replica in replicas))


def instances_where_first_polls(uri: str, count: int) -> list[str]:
    """`count` replica names of which the first is the one rendezvous hashing picks to poll the public `uri`."""
    hashed = key_hash(WatchKey("resource", uri, "public"))
    for attempt in range(10_000):
        names = [f"replica-{attempt}-{n}" for n in range(count)]
        if rendezvous_owner(names, hashed) == names[0]:
            return names
    raise AssertionError("no such names")  # 1/count of all attempts qualify: unreachable


async def leases_held(replicas: Sequence[Replica]) -> list[int]:
    """The keys each replica polls for the cluster (`mcp_sidecar_leases_held`), in order."""
    return [int((await replica.metrics()).total("mcp_sidecar_leases_held")) for replica in replicas]


# -- nginx ----------------------------------------------------------------------------------------------------------

_NGINX_CONF = """\
{user}worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log info;
events {{ worker_connections 1024; }}
http {{
    access_log {dir}/access.log;
{temp_paths}    upstream sidecars {{
{servers}
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://sidecars;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # The sidecar refuses a non-loopback Host (DNS rebinding); pass the client's on.
            proxy_set_header Host $http_host;
            # Who the client is, for a sidecar that trusts this proxy (listen.trusted_proxies).
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_read_timeout {read_timeout_s}s;
            # proxy_buffering stays on (the default): the sidecar's X-Accel-Buffering: no turns it off per stream.
        }}
    }}
}}
"""


class Nginx(OnLoopback):
    """nginx in the foreground with a config of its own in `workdir`: round-robin over `backends`."""

    def __init__(self, workdir: Path, backends: Sequence[int], read_timeout_s: int = 5) -> None:
        self.binary = require_binary("nginx")
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.port = free_port()
        user, temp_paths = nginx_preamble(workdir)
        servers = "\n".join(f"        server 127.0.0.1:{port};" for port in backends)
        self.conf = workdir / "nginx.conf"
        self.conf.write_text(
            _NGINX_CONF.format(
                user=user, temp_paths=temp_paths, dir=workdir, servers=servers, port=self.port,
                read_timeout_s=read_timeout_s,
            ),
            encoding="utf-8",
        )  # fmt: skip
        argv = nginx_argv(self.binary, workdir, self.conf)
        self.service = ServerProcess("nginx", argv, workdir / "nginx.out", other_logs=[workdir / "error.log"])

    async def start(self) -> None:
        # Ready when a sidecar behind it answers /healthz through it; a failure shows nginx's error.log too.
        await self.service.start(http_answers(self.base_url + "/healthz"), START_TIMEOUT_S)


@contextlib.asynccontextmanager
async def nginx_proxy(tmp_path: Path, backends: Sequence[int], read_timeout_s: int = 5) -> AsyncIterator[Nginx]:
    nginx = Nginx(tmp_path / "nginx", backends, read_timeout_s)
    try:
        await nginx.start()
        yield nginx
    finally:
        await nginx.service.stop()
