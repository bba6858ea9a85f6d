"""`mcp-sidecar run --upstream "<stdio command>"` as a real process: both client eras served, and SIGTERM
leaves no process of the child behind (checked in the process table)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from mcp import Client
from mcp.client.subscriptions import ResourceUpdated

from tests.helpers import rpc
from tests.peers.stdio_notes_server import NOTE_URI
from tests.peers.stdio_peers import (
    REPO_ROOT,
    live_processes,
    notes_command,
    session_members,
    session_of,
    toy_command,
)

START_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 15.0


class _Run:
    """One `python -m sidecar.cli run ...` process; its stderr (JSON log lines) collected as it comes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.stderr: list[str] = []
        self._listening: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            text = line.decode(errors="replace").rstrip("\n")
            self.stderr.append(text)
            if '"mcp-sidecar listening"' in text and not self._listening.done():
                self._listening.set_result(json.loads(text)["url"])
        if not self._listening.done():
            self._listening.set_exception(AssertionError("exited before listening:\n" + "\n".join(self.stderr)))

    async def url(self) -> str:
        async with asyncio.timeout(START_TIMEOUT_S):
            return await asyncio.shield(self._listening)

    async def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(EXIT_TIMEOUT_S):
            code = await self.proc.wait()
            await self._reader
        return code


@contextlib.asynccontextmanager
async def _run(*args: str) -> AsyncIterator[_Run]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MCP_SIDECAR__")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sidecar.cli", "run", *args, cwd=REPO_ROOT, env={**env, "PYTHONUNBUFFERED": "1"},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    run = _Run(proc)
    try:
        yield run
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        run._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run._reader


async def test_run_with_a_command_serves_both_eras_and_sigterm_leaves_no_process(tmp_path: Path) -> None:
    note = tmp_path / "note.txt"
    note.write_text("first", encoding="utf-8")
    command = shlex.join(notes_command(note, read_ttl_ms=300))
    async with _run("--upstream", command, "--port", "0") as run:
        url = await run.url()
        async with Client(url, cache=None) as client:
            assert client.protocol_version == "2026-07-28"
            server_pid = int((await client.call_tool("server_pid")).content[0].text)  # type: ignore[union-attr]
            async with client.listen(resource_subscriptions=[NOTE_URI]) as subscription:
                note.write_text("second", encoding="utf-8")
                async with asyncio.timeout(START_TIMEOUT_S):
                    assert await anext(subscription) == ResourceUpdated(uri=NOTE_URI)
        async with Client(url, cache=None, mode="legacy") as legacy:
            assert legacy.protocol_version == "2025-11-25"
            assert (await legacy.read_resource(NOTE_URI)).contents[0].text == "second"  # type: ignore[union-attr]
        assert session_members(server_pid) == [server_pid]  # the child leads a session (and group) of its own
        assert await run.stop() == 0, "\n".join(run.stderr)
    assert live_processes([server_pid]) == []
    assert not any("Traceback" in line for line in run.stderr)


async def test_sigterm_reaches_every_process_of_a_wrapper_chain(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    pids = tmp_path / "pids"
    # sh (not exec'd) starts a python wrapper that ignores SIGTERM and forwards nothing, which starts the server.
    chain = shlex.join(toy_command("--wrapper", "--pid-file", str(pids))) + "; true"
    async with _run("--upstream", shlex.join(["sh", "-c", chain]), "--port", "0") as run:
        url = await run.url()
        status, reply = await rpc(http, url, "tools/call", {"name": "pid", "arguments": {}})
        assert status == 200, reply
        wrapper, server = (int(line) for line in pids.read_text().split())
        shell = session_of(server)  # sh leads the session (and the process group) the sidecar gave the child
        assert set(session_members(shell)) == {shell, wrapper, server}
        assert await run.stop() == 0, "\n".join(run.stderr)
    assert live_processes([shell, wrapper, server]) == []


async def test_a_command_that_cannot_start_exits_1_saying_why() -> None:
    async with _run("--upstream", "/nonexistent/mcp-server --stdio", "--port", "0") as run:
        async with asyncio.timeout(START_TIMEOUT_S):
            assert await run.proc.wait() == 1
            await run._reader
    assert any(
        "upstream.command: cannot start '/nonexistent/mcp-server': No such file or directory" in line
        for line in run.stderr
    ), run.stderr
