"""Everything the bench starts, each a child process on 127.0.0.1 on a free port, stopped when its stack unwinds.

Every `start_*` registers the stop on the caller's AsyncExitStack, so a scenario that fails or is cancelled
(Ctrl-C) still stops what it started; `ALL` lets the bench kill leftovers as a last resort. Each process is a
`tests.procs.ServerProcess`, as in the tests.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from bench.common import REPO_ROOT, python_argv
from tests.procs import (
    OnLoopback,
    ServerProcess,
    find_binary,
    free_port,
    http_answers,
    nginx_argv,
    nginx_preamble,
    redis_answers,
    redis_argv,
)

__all__ = [
    "ALL",
    "CONFIGS",
    "LOOP_ENV",
    "LoadClient",
    "Service",
    "Sidecar",
    "kill_leftovers",
    "peer_proxy_missing",
    "redis_missing",
    "start_fast_upstream",
    "start_loadgen",
    "start_naive_proxy",
    "start_nginx",
    "start_peer_proxy",
    "start_redis",
    "start_sdk_upstream",
    "start_sidecar",
    "start_supergateway",
    "stdio_upstream_argv",
    "supergateway_missing",
    "uvloop_missing",
]

ALL: list[ServerProcess] = []
"""Every process the bench started, for a last-resort SIGKILL."""
CONFIGS: dict[str, dict[str, Any]] = {}
"""Every sidecar's config, by process name (for RESULTS.md)."""


def kill_leftovers() -> None:
    for proc in ALL:
        if proc.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)


@dataclass
class Service(OnLoopback):
    name: str
    port: int
    proc: ServerProcess


@dataclass
class Sidecar(Service):
    config: dict[str, Any]

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def admin_url(self) -> str:
        """The admin listener (/metrics, /status)."""
        return f"http://127.0.0.1:{self.config['admin']['port']}"


START_TIMEOUT_S = 30.0
"""The bench starts servers while others are loaded: a generous bound."""
LOOP_ENV = "BENCH_SIDECAR_LOOP"
"""`asyncio` or `uvloop` runs every sidecar the bench starts on that loop (unless a scenario asks for a loop
itself); unset, each runs on the loop `listen.event_loop: auto` picks (uvloop on Linux, where installed)."""
_UVLOOP_BOOT = "import sys, uvloop; uvloop.install(); from sidecar.cli import main; sys.exit(main(sys.argv[1:]))"
"""The sidecar's own CLI on uvloop: the policy is installed before `asyncio.run` makes the loop. Run with
`-c`, so the `sidecar` package comes from the working directory, as with `-m`."""


def _knows_event_loop(tree: Path) -> bool:
    sections = tree / "sidecar" / "config" / "sections.py"
    return sections.exists() and "event_loop" in sections.read_text(encoding="utf-8")


def uvloop_missing() -> str | None:
    if importlib.util.find_spec("uvloop") is None:
        return "uvloop is not installed (pip install uvloop)"
    return None


async def _start(
    stack: contextlib.AsyncExitStack, proc: ServerProcess, probe_url: str, within_s: float = START_TIMEOUT_S
) -> None:
    ALL.append(proc)
    stack.push_async_callback(proc.stop)
    await proc.spawn()
    await proc.wait_ready(http_answers(probe_url), within_s)


async def start_fast_upstream(
    stack: contextlib.AsyncExitStack, workdir: Path, *, read_delay_ms: float = 0.0
) -> Service:
    """The fast upstream; with `read_delay_ms`, every read takes that long (a slow upstream)."""
    port = free_port()
    argv = python_argv("bench.fast_upstream", "--port", str(port), "--read-delay-ms", str(read_delay_ms))
    proc = ServerProcess("fast-upstream", argv, workdir / "fast-upstream.log")
    service = Service("fast-upstream", port, proc)
    await _start(stack, proc, f"{service.base_url}/admin/health")
    return service


async def start_sdk_upstream(stack: contextlib.AsyncExitStack, workdir: Path, read_ttl_ms: int) -> Service:
    port = free_port()
    argv = python_argv("bench.sdk_upstream", "--port", str(port), "--read-ttl-ms", str(read_ttl_ms))
    proc = ServerProcess("sdk-upstream", argv, workdir / f"sdk-upstream-{port}.log")
    service = Service("sdk-upstream", port, proc)
    await _start(stack, proc, f"{service.base_url}/admin/health")
    return service


def sidecar_config(upstream_url: str, port: int, sections: dict[str, dict[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {
        "upstream": {"url": upstream_url},
        "listen": {"host": "127.0.0.1", "port": port, "shutdown_grace_s": 2},
        "admin": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"level": "warning", "format": "json"},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return data


async def start_sidecar(
    stack: contextlib.AsyncExitStack,
    workdir: Path,
    name: str,
    upstream_url: str,
    sections: dict[str, dict[str, Any]] | None = None,
    workers: int = 1,
    *,
    event_loop: str | None = None,
    tree: Path = REPO_ROOT,
) -> Sidecar:
    """`python -m sidecar.cli run --config FILE [--workers N]`, ready when /readyz answers 200.

    `event_loop`: `asyncio` or `uvloop` (default: $BENCH_SIDECAR_LOOP, else the sidecar's own choice). `tree`: the
    checkout whose `sidecar` package runs (its working directory), so two versions can be measured side by side.
    """
    port = free_port()
    loop = event_loop or os.environ.get(LOOP_ENV) or "default"
    sections = dict(sections or {})
    if loop == "asyncio" and _knows_event_loop(tree):
        # Checkouts from before listen.event_loop ran on asyncio's loop anyway (and would refuse the key).
        sections["listen"] = {**sections.get("listen", {}), "event_loop": "asyncio"}
    config = sidecar_config(upstream_url, port, sections)
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    args = ["run", "--config", str(path)]
    if workers > 1:
        args += ["--workers", str(workers)]
    if loop == "uvloop":
        argv = [sys.executable, "-c", _UVLOOP_BOOT, *args]
    elif loop in ("asyncio", "default"):
        argv = python_argv("sidecar.cli", *args)
    else:
        raise ValueError(f"unknown event loop {loop!r} (asyncio or uvloop)")
    proc = ServerProcess(name, argv, workdir / f"{name}.log", cwd=tree)
    sidecar = Sidecar(name, port, proc, config)
    CONFIGS[name] = config
    await _start(stack, proc, f"{sidecar.base_url}/readyz")
    return sidecar


_NGINX_CONF = """\
{user}worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
{temp_paths}    upstream backend {{
        server 127.0.0.1:{backend};
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


def nginx_missing() -> str | None:
    return None if find_binary("nginx") else "nginx is not installed (Debian package `nginx`)"


async def start_nginx(stack: contextlib.AsyncExitStack, workdir: Path, backend_port: int) -> Service:
    """nginx as a plain reverse proxy (one worker, keep-alive to the backend) with a temp config."""
    binary = find_binary("nginx")
    assert binary is not None
    home = workdir / "nginx"
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    user, temp_paths = nginx_preamble(home)
    conf = home / "nginx.conf"
    conf.write_text(
        _NGINX_CONF.format(user=user, temp_paths=temp_paths, dir=home, backend=backend_port, port=port),
        encoding="utf-8",
    )
    proc = ServerProcess("nginx", nginx_argv(binary, home, conf), home / "nginx.out", other_logs=[home / "error.log"])
    service = Service("nginx", port, proc)
    # nginx proxies /admin/health to the backend: ready means both listen.
    await _start(stack, proc, f"{service.base_url}/admin/health")
    return service


def redis_missing() -> str | None:
    if not find_binary("redis-server"):
        return "redis-server is not installed (Debian package `redis-server`)"
    if importlib.util.find_spec("redis") is None:
        return "the `redis` Python package is missing (pip install -e '.[redis]')"
    return None


async def start_redis(stack: contextlib.AsyncExitStack, workdir: Path) -> str:
    """redis-server in the foreground without persistence; returns its URL."""
    binary = find_binary("redis-server")
    assert binary is not None
    home = workdir / "redis"
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = ServerProcess("redis-server", redis_argv(binary, port, home), home / "redis.log")
    ALL.append(proc)
    stack.push_async_callback(proc.stop)
    await proc.spawn()
    await proc.wait_ready(redis_answers(port), START_TIMEOUT_S)
    return f"redis://127.0.0.1:{port}/0"


def stdio_upstream_argv() -> list[str]:
    """The fast stdio server (bench/fast_stdio_upstream.py), as a command run from the repository root."""
    return python_argv("bench.fast_stdio_upstream")


_TOOLS = REPO_ROOT / ".tools"
_NODE = _TOOLS / "node22" / "node_modules" / ".bin" / "node"
_SUPERGATEWAY = _TOOLS / "supergateway" / "node_modules" / "supergateway" / "dist" / "index.js"


def supergateway_missing() -> str | None:
    for path in (_NODE, _SUPERGATEWAY):
        if not path.exists():
            return f"{path.relative_to(REPO_ROOT)} is missing (bash .ci/install-peers installs it)"
    return None


async def start_supergateway(stack: contextlib.AsyncExitStack, workdir: Path, stdio_argv: list[str]) -> Service:
    """supergateway (npm), the stdio-to-HTTP bridge people use today: `stdio_argv` served as Streamable HTTP,
    stateful (one child per session; its stateless mode starts a child per request)."""
    port = free_port()
    argv = [
        str(_NODE), str(_SUPERGATEWAY), "--stdio", shlex.join(stdio_argv), "--outputTransport", "streamableHttp",
        "--stateful", "--port", str(port), "--healthEndpoint", "/admin/health", "--logLevel", "none",
    ]  # fmt: skip
    proc = ServerProcess("supergateway", argv, workdir / "supergateway.log")
    service = Service("supergateway", port, proc)
    await _start(stack, proc, f"{service.base_url}/admin/health")
    return service


async def start_naive_proxy(
    stack: contextlib.AsyncExitStack, workdir: Path, upstream_url: str, *, event_loop: str = "asyncio"
) -> Service:
    """bench/naive_proxy.py: read, parse, post upstream on one shared session, return (the floor of a Python hop)."""
    port = free_port()
    name = "naive-proxy" if event_loop == "asyncio" else f"naive-proxy-{event_loop}"
    argv = python_argv("bench.naive_proxy", "--port", str(port), "--upstream", upstream_url, "--loop", event_loop)
    proc = ServerProcess(name, argv, workdir / f"{name}.log")
    service = Service(name, port, proc)
    await _start(stack, proc, f"{service.base_url}/healthz")
    return service


def peer_proxy_missing() -> str | None:
    if importlib.util.find_spec("fastmcp") is None:
        return "fastmcp is not installed (pip install -e '.[bench]')"
    return None


async def start_peer_proxy(
    stack: contextlib.AsyncExitStack, workdir: Path, upstream_url: str, *, reuse_session: bool
) -> Service:
    port = free_port()
    argv = python_argv("bench.peer_proxy", "--port", str(port), "--upstream", upstream_url)
    name = "peer-proxy-shared" if reuse_session else "peer-proxy"
    if reuse_session:
        argv.append("--reuse-session")
    proc = ServerProcess(name, argv, workdir / f"{name}.log", env={"FASTMCP_LOG_LEVEL": "WARNING"})
    service = Service(name, port, proc)

    ALL.append(proc)
    stack.push_async_callback(proc.stop)
    await proc.spawn()
    # FastMCP has no health route; any HTTP answer on /mcp means it listens.
    await proc.wait_ready(http_answers(service.url, accept=lambda status: status < 500), 60.0)
    return service


class LoadClient:
    """The load generator process and its command channel (JSON lines on its stdin and stdout)."""

    def __init__(self, proc: ServerProcess) -> None:
        self.proc = proc

    async def call(self, cmd: str, **fields: Any) -> dict[str, Any]:
        process = self.proc.proc
        assert process is not None and process.stdin is not None and process.stdout is not None
        process.stdin.write(orjson.dumps({"cmd": cmd, **fields}) + b"\n")
        await process.stdin.drain()
        line = await process.stdout.readline()
        if not line:
            raise RuntimeError(f"load generator exited during {cmd!r}\n{self.proc.log_tail()}")
        answer: dict[str, Any] = orjson.loads(line)
        if "error" in answer:
            raise RuntimeError(f"load generator failed {cmd!r}: {answer['error']}\n{answer.get('traceback', '')}")
        return answer

    async def quit(self) -> None:
        process = self.proc.proc
        if process is not None and process.returncode is None and process.stdin is not None:
            with contextlib.suppress(OSError, RuntimeError):
                process.stdin.write(b'{"cmd": "quit"}\n')
                await process.stdin.drain()
                process.stdin.close()
        await self.proc.stop()


async def start_loadgen(stack: contextlib.AsyncExitStack, workdir: Path, name: str = "loadgen") -> LoadClient:
    proc = ServerProcess(name, [sys.executable, "-m", "bench.loadgen"], workdir / f"{name}.log")
    ALL.append(proc)
    client = LoadClient(proc)
    stack.push_async_callback(client.quit)
    await proc.spawn(pipes=True, limit=2**26)
    return client
