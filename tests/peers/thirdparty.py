"""Third-party MCP peers as child processes on 127.0.0.1: servers and a client nobody on this project wrote.

    async with start_everything(tmp_path) as everything:          # npm reference server, streamable HTTP
        ...  # everything.url
    async with start_fastmcp1(tmp_path, notes, event_store=True) as notes_server:   # FastMCP on the 1.x SDK
        ...
    async with Mcp1Client.run(url, tmp_path, "--subscribe", uri, "--wait-updated", "5") as client:
        step = await client.step("subscribed")                    # its JSON lines, one per step

Everything here comes from `bash .ci/install-peers` (pinned, under `.tools/`, gitignored): Node 22, the npm
package `@modelcontextprotocol/server-everything`, and a venv with the 1.x Python SDK. `missing()` names
what is absent, for a skip reason that tells how to install it.

server-everything's HTTP transport listens on every interface; `loopback.mjs` (a Node preload of ours) makes
it listen on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.procs import REPO_ROOT, OnLoopback, Probe, ServerProcess, free_port, http_answers

__all__ = [
    "EVERYTHING_JS",
    "EVERYTHING_VERSION",
    "INSTALL_HINT",
    "MCP1_VERSION",
    "NODE",
    "VENV1_PYTHON",
    "Mcp1Client",
    "ThirdPartyServer",
    "missing",
    "start_everything",
    "start_fastmcp1",
]

TOOLS = REPO_ROOT / ".tools"
NODE = TOOLS / "node22" / "node_modules" / ".bin" / "node"
EVERYTHING_PACKAGE = TOOLS / "server-everything" / "node_modules" / "@modelcontextprotocol" / "server-everything"
EVERYTHING_JS = EVERYTHING_PACKAGE / "dist" / "index.js"
EVERYTHING_VERSION = "2026.8.31"
VENV1_PYTHON = TOOLS / "venv-mcp1" / "bin" / "python"
MCP1_VERSION = "1.30.0"
INSTALL_HINT = "bash .ci/install-peers"

PEERS_DIR = Path(__file__).resolve().parent
LOOPBACK_PRELOAD = PEERS_DIR / "loopback.mjs"
FASTMCP1_SERVER = PEERS_DIR / "fastmcp1_server.py"
MCP1_CLIENT = PEERS_DIR / "mcp1_client.py"

START_TIMEOUT_S = 30.0
"""Node and a fresh venv import a lot; on a loaded 2-core machine a cold start takes several seconds."""
STOP_TIMEOUT_S = 5.0
STEP_TIMEOUT_S = 30.0
"""Default bound on one step of the 1.x client (a step that waits for a notification gets its own)."""


def missing() -> str | None:
    """What of `.tools/` is absent (a sentence naming the install command), or None when all is there."""
    absent = [
        str(path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path)
        for path in (NODE, EVERYTHING_JS, VENV1_PYTHON)
        if not path.exists()
    ]
    if not absent:
        return None
    return f"third-party peers not installed ({', '.join(absent)} missing); run: {INSTALL_HINT}"


@dataclass
class ThirdPartyServer(OnLoopback):
    """A started third-party server: its MCP endpoint and its process."""

    name: str
    port: int
    process: ServerProcess
    probe: Probe
    """True once it answers (after a start, or a restart)."""

    async def restart(self) -> None:
        """Stop it and start it again on the same port, as a fresh process: it forgets every session."""
        await self.process.stop(STOP_TIMEOUT_S)
        await self.process.start(self.probe, START_TIMEOUT_S)


@contextlib.asynccontextmanager
async def start_everything(workdir: Path) -> AsyncIterator[ThirdPartyServer]:
    """server-everything in `streamableHttp` mode on a free loopback port; ready when /mcp answers at all."""
    port = free_port()
    argv = [str(NODE), "--import", LOOPBACK_PRELOAD.as_uri(), str(EVERYTHING_JS), "streamableHttp"]
    process = ServerProcess(
        f"server-everything:{port}", argv, workdir / f"everything-{port}.log", env={"PORT": str(port)}
    )
    # It has no health route: a GET /mcp without a session is answered 400, which is enough to know it listens.
    probe = http_answers(f"http://127.0.0.1:{port}/mcp", accept=lambda status: status < 500)
    server = ThirdPartyServer("server-everything", port, process, probe)
    async with process.serving(probe, START_TIMEOUT_S):
        yield server


@contextlib.asynccontextmanager
async def start_fastmcp1(
    workdir: Path, notes: Path, *, event_store: bool, retry_ms: int | None = None
) -> AsyncIterator[ThirdPartyServer]:
    """`fastmcp1_server.py` under the 1.x venv, reading and writing `notes`; ready when /health answers."""
    port = free_port()
    argv = [str(VENV1_PYTHON), str(FASTMCP1_SERVER), "--port", str(port), "--notes", str(notes)]
    if event_store:
        argv.append("--event-store")
    if retry_ms is not None:
        argv += ["--retry-ms", str(retry_ms)]
    name = "fastmcp1-eventstore" if event_store else "fastmcp1"
    process = ServerProcess(f"{name}:{port}", argv, workdir / f"{name}-{port}.log")
    server = ThirdPartyServer(name, port, process, http_answers(f"http://127.0.0.1:{port}/health"))
    async with process.serving(server.probe, START_TIMEOUT_S):
        yield server


class Mcp1Client:
    """`mcp1_client.py` (a genuine 1.x SDK client) as a child process; its steps arrive as JSON lines."""

    _runs = itertools.count(1)
    """Numbers each run's log file, so two runs in one test keep both logs."""

    def __init__(self, process: ServerProcess) -> None:
        self.process = process
        self.steps: list[dict[str, Any]] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def run(cls, url: str, workdir: Path, *args: str) -> AsyncIterator[Mcp1Client]:
        """Start the client against `url` with the script's `args`; it is stopped when the block is left."""
        argv = [str(VENV1_PYTHON), str(MCP1_CLIENT), url, *args]
        log = workdir / f"mcp1-client-{next(cls._runs)}.log"
        process = ServerProcess("mcp1-client", argv, log)
        await process.spawn(pipes=True, limit=2**24)
        try:
            yield cls(process)
        finally:
            await process.stop(STOP_TIMEOUT_S)

    async def _next_line(self) -> dict[str, Any]:
        proc = self.process.proc
        assert proc is not None and proc.stdout is not None
        line = await proc.stdout.readline()
        if not line:
            code = await self.process.wait(STOP_TIMEOUT_S)
            raise AssertionError(
                f"the 1.x client exited ({code}) after {[s['step'] for s in self.steps]}\n{self.process.log_tail()}"
            )
        step: dict[str, Any] = json.loads(line)
        self.steps.append(step)
        return step

    async def step(self, name: str, within_s: float = STEP_TIMEOUT_S) -> dict[str, Any]:
        """The next step called `name`, skipping others; an `error` step or the end of output fails."""
        try:
            async with asyncio.timeout(within_s):
                while True:
                    step = await self._next_line()
                    if step["step"] == name:
                        return step
                    if step["step"] == "error":
                        raise AssertionError(f"the 1.x client failed at {step.get('at')}: {step.get('error')}")
        except TimeoutError:
            raise AssertionError(
                f"no {name!r} step from the 1.x client within {within_s} s; steps so far: "
                f"{[s['step'] for s in self.steps]}\n{self.process.log_tail()}"
            ) from None

    async def finish(self, within_s: float = STEP_TIMEOUT_S) -> dict[str, dict[str, Any]]:
        """Every step by name, once the client has exited 0; an `error` step fails with its message."""
        async with asyncio.timeout(within_s):
            while not self.steps or self.steps[-1]["step"] not in ("done", "error"):
                await self._next_line()
        last = self.steps[-1]
        if last["step"] == "error":
            raise AssertionError(f"the 1.x client failed at {last.get('at')}: {last.get('error')}")
        assert await self.process.wait(STOP_TIMEOUT_S) == 0, self.process.log_tail()
        return {step["step"]: step for step in self.steps}
