"""Server processes for the tests and the bench: start one on 127.0.0.1, wait until it answers, stop it.

The one place that spawns a server (redis-server, nginx, Prometheus, sidecar replicas, the SDK peers, the
third-party peers, the bench's upstreams and load generator) and stops it again: SIGTERM, then SIGKILL after a
bound. Each server runs in the foreground of its own child process, its output appended to a log file that
failures quote (with the tails of any other logs it writes, such as nginx's error.log). Readiness is a probe the
caller gives (an HTTP route that answers, a PING), polled until it passes, the process exits, or the bound
runs out. The command lines of the foreign servers that both tests and bench run (redis-server, nginx) are
here too, so each is written once.

    server = ServerProcess("nginx", nginx_argv(binary, home, conf), home / "nginx.out")
    async with server.serving(http_answers(f"{base}/healthz"), within_s=15.0):
        ...  # ready here; stopped when the block is left, however it is left

Nothing here imports pytest: the bench uses it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import pwd
import shutil
import signal
import socket
import ssl as ssl_module
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import aiohttp

__all__ = [
    "REPO_ROOT",
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "OnLoopback",
    "Probe",
    "ServerProcess",
    "child_env",
    "find_binary",
    "free_port",
    "http_answers",
    "nginx_argv",
    "nginx_preamble",
    "redis_answers",
    "redis_argv",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 20.0
"""Default bound on a start; callers with a known slower or faster server pass their own."""
STOP_TIMEOUT_S = 10.0
"""Default grace between SIGTERM and SIGKILL."""
_PROBE_INTERVAL_S = 0.05
_SBIN = "/usr/local/sbin:/usr/sbin:/sbin"
"""Where Debian puts nginx and redis-server; a non-root PATH often lacks these."""

Probe = Callable[[], Awaitable[bool]]
"""True once the server answers; must not raise for "not yet"."""


class OnLoopback:
    """Mixin for a server on 127.0.0.1:`port` (set by the subclass) whose MCP endpoint is `/mcp`."""

    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The MCP endpoint, `http://127.0.0.1:<port>/mcp`."""
        return f"{self.base_url}/mcp"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (a server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def find_binary(name: str) -> str | None:
    """The path of `name` on PATH or in the sbin directories, or None."""
    return shutil.which(name) or shutil.which(name, path=_SBIN)


def child_env(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment without the developer's MCP_SIDECAR__ variables (they would reconfigure a sidecar child),
    unbuffered Python output (logs reach the file as they happen), plus `overrides`."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("MCP_SIDECAR__")}
    return {**env, "PYTHONUNBUFFERED": "1", **(overrides or {})}


def http_answers(
    url: str,
    *,
    timeout_s: float = 2.0,
    accept: Callable[[int], bool] | None = None,
    ssl: ssl_module.SSLContext | None = None,
) -> Probe:
    """A probe: GET `url` on a fresh connection answers 200 (or a status `accept` likes); `ssl`: the client
    context for an https `url` whose certificate a private CA signed."""
    wanted = accept or (lambda status: status == 200)
    timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def probe() -> bool:
        # A fresh connection each time: a pooled one could outlive a restart, or pin one of several workers.
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
            async with (
                aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(force_close=True)) as http,
                http.get(url, ssl=ssl if ssl is not None else True) as resp,
            ):
                return wanted(resp.status)
        return False

    return probe


def redis_answers(port: int, *, timeout_s: float = 1.0) -> Probe:
    """A probe: a redis-server on 127.0.0.1:`port` answers PING with PONG."""

    async def probe() -> bool:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout_s)
        except (OSError, TimeoutError):
            return False
        try:
            writer.write(b"PING\r\n")
            await writer.drain()
            return await asyncio.wait_for(reader.readline(), timeout_s) == b"+PONG\r\n"
        except (OSError, TimeoutError):
            return False
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    return probe


def redis_argv(binary: str, port: int, workdir: Path) -> list[str]:
    """redis-server in the foreground on 127.0.0.1:`port`, without persistence (nothing outlives the test)."""
    return [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(workdir)]  # fmt: skip


def nginx_argv(binary: str, home: Path, conf: Path) -> list[str]:
    """nginx in the foreground with `conf`, its prefix and early error log in `home` (never the system's)."""
    return [binary, "-p", str(home), "-c", str(conf), "-e", str(home / "error.log"), "-g", "daemon off;"]


def nginx_preamble(home: Path) -> tuple[str, str]:
    """(main-context lines, http-context lines) every nginx config here needs: as root, a `user` line naming
    root (its workers would otherwise switch to a user who cannot write `home`), and temp paths in `home`."""
    user = f"user {pwd.getpwuid(0).pw_name} {grp.getgrgid(0).gr_name};\n" if os.geteuid() == 0 else ""
    temp = "".join(
        f"    {kind}_temp_path {home}/{folder};\n"
        for kind, folder in (("client_body", "client_body"), ("proxy", "proxy"), ("fastcgi", "fastcgi"),
                             ("uwsgi", "uwsgi"), ("scgi", "scgi"))
    )  # fmt: skip
    return user, temp


class ServerProcess:
    """One foreground child process; stderr (and stdout, unless piped) is appended to `log_path`.

    `env` entries are added to `child_env()`. `other_logs` are files the server writes itself (nginx's
    error.log): their tails join the log tail a failure shows. `stop` is idempotent, and a no-op for one never
    started.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path = REPO_ROOT,
        other_logs: Sequence[Path] = (),
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = child_env(env)
        self.cwd = cwd
        self.other_logs = list(other_logs)
        self.proc: asyncio.subprocess.Process | None = None

    async def spawn(self, *, pipes: bool = False, limit: int = 2**16) -> None:
        """Start the process. With `pipes`, stdin and stdout are pipes (a command channel); stderr still logs."""
        with self.log_path.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, cwd=self.cwd, env=self.env,
                stdin=asyncio.subprocess.PIPE if pipes else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE if pipes else out,
                stderr=out if pipes else asyncio.subprocess.STDOUT,
                limit=limit,
            )  # fmt: skip

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 60) -> str:
        tail = f"-- {self.name} ({self.log_path}) --\n" + "\n".join(self.log_text().splitlines()[-lines:])
        for path in self.other_logs:
            text = path.read_text(errors="replace") if path.exists() else "(not written)"
            tail += f"\n-- {path.name} --\n" + "\n".join(text.splitlines()[-lines:])
        return tail

    async def wait_ready(self, probe: Probe, within_s: float = START_TIMEOUT_S) -> None:
        """Until `probe()` is true. RuntimeError at once if the process exits; TimeoutError after `within_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while True:
            if not self.running:
                raise RuntimeError(f"{self.name} exited with {self.returncode} before it was ready\n{self.log_tail()}")
            if await probe():
                return
            if loop.time() > deadline:
                raise TimeoutError(f"{self.name} not ready after {within_s} s\n{self.log_tail()}")
            await asyncio.sleep(_PROBE_INTERVAL_S)  # polling another process until it listens, bounded

    async def start(self, probe: Probe, within_s: float = START_TIMEOUT_S) -> None:
        """Spawn and wait until ready; a process that never gets ready is killed before the error propagates."""
        await self.spawn()
        try:
            await self.wait_ready(probe, within_s)
        except BaseException:
            await self.kill()
            raise

    @contextlib.asynccontextmanager
    async def serving(
        self, probe: Probe, within_s: float = START_TIMEOUT_S, *, stop_within_s: float = STOP_TIMEOUT_S
    ) -> AsyncIterator[ServerProcess]:
        """Started and ready inside the block, stopped (SIGKILL after `stop_within_s`) when it is left."""
        try:
            await self.start(probe, within_s)
            yield self
        finally:
            await self.stop(stop_within_s)

    async def wait(self, within_s: float = STOP_TIMEOUT_S) -> int:
        """The exit code, waited for (bounded)."""
        assert self.proc is not None, f"{self.name} was never started"
        async with asyncio.timeout(within_s):
            return await self.proc.wait()

    async def signal(self, signum: int) -> None:
        if self.proc is not None and self.running:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)

    async def kill(self) -> None:
        """SIGKILL (kill -9) and reap; a no-op when it is not running."""
        if self.proc is not None and self.running:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()

    async def stop(self, within_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, then SIGKILL after `within_s`; the exit code (None if never started)."""
        if self.proc is None:
            return None
        if self.running:
            await self.signal(signal.SIGTERM)
            try:
                await self.wait(within_s)
            except TimeoutError:
                await self.kill()
        return self.proc.returncode
