"""Real services for the scale-out tests: redis-server, nginx and sidecar replicas, each a process on 127.0.0.1.

Every service is a `tests.procs.ServerProcess`: in the foreground of its own subprocess, in a temp dir of the
test, with its output in a log file there (shown when it fails to start), and stopped when its block is left:
SIGTERM, SIGKILL after a bound.

    async with redis_server(tmp_path) as redis, sidecar_replicas(tmp_path, up.url, redis.url, 3) as replicas,
               nginx_proxy(tmp_path, [r.port for r in replicas]) as lb:
        ...

`require_binary` skips the calling test (with the reason) when redis-server or nginx is not installed. Redis
itself (one server, or a Redis Cluster) is `tests.redis_nodes`, its names re-exported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from sidecar.bus.layout import key_hash
from sidecar.bus.ownership import rendezvous_owner
from sidecar.changes import WatchKey
from sidecar.observability.logs import INSTANCE_ENV
from tests.kit import Scrape, parse
from tests.procs import (
    START_TIMEOUT_S,
    OnLoopback,
    ServerProcess,
    free_port,
    http_answers,
    nginx_argv,
    nginx_preamble,
)
from tests.redis_nodes import RedisClusterNodes, RedisServer, redis_cluster, redis_server, require_binary

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
    "sidecar_replica",
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
        """The admin listener's `/readyz`: the one that says why (the client listener's says only whether)."""
        status, text = await self._get("/readyz", admin=True)
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
            return (await self._get("/readyz"))[0] == 200  # the MCP port itself listens, and says ready
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
async def sidecar_replica(tmp_path: Path, upstream_url: str, **sections: Any) -> AsyncIterator[Replica]:
    """One `mcp-sidecar run` process in front of `upstream_url` (no bus), ready inside the block, stopped after."""
    replica = Replica("sidecar", tmp_path / "sidecar", sidecar_config(upstream_url, free_port(), **sections))
    try:
        await replica.start()
        yield replica
    finally:
        await replica.service.stop()


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
