"""The one CLI-process helper: `python -m sidecar.cli ...` as a real process whose stdout and stderr lines are
collected as they arrive, waited on by pattern or by JSON log record, stopped by signal with a bounded wait."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

__all__ = ["EXIT_TIMEOUT_S", "REPO_ROOT", "START_TIMEOUT_S", "Cli", "cli", "cli_env"]

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 20.0
EXIT_TIMEOUT_S = 10.0
"""How long a signalled process may take to exit; shutdown with nothing in flight is near instant."""


def cli_env(base: Mapping[str, str] | None = None, **overrides: str) -> dict[str, str]:
    """This environment (or `base`) without any MCP_SIDECAR__ variable of the developer's, plus `overrides`."""
    source = os.environ if base is None else base
    env = {key: value for key, value in source.items() if not key.startswith("MCP_SIDECAR__")}
    return {**env, "PYTHONUNBUFFERED": "1", **overrides}


class Cli:
    """One running `python -m sidecar.cli ...`; stdout and stderr lines are collected as they arrive."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        start_timeout_s: float = START_TIMEOUT_S,
        exit_timeout_s: float = EXIT_TIMEOUT_S,
    ) -> None:
        self.proc = proc
        self.start_timeout_s = start_timeout_s
        self.exit_timeout_s = exit_timeout_s
        self.lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._arrived = asyncio.Condition()
        assert proc.stdout is not None and proc.stderr is not None
        self._readers = [
            asyncio.create_task(self._collect("stdout", proc.stdout)),
            asyncio.create_task(self._collect("stderr", proc.stderr)),
        ]

    async def _collect(self, name: str, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            async with self._arrived:
                self.lines[name].append(line.decode(errors="replace").rstrip("\n"))
                self._arrived.notify_all()
        async with self._arrived:
            self._arrived.notify_all()  # end of output: let waiters see the exit

    async def wait_for_line(self, name: str, pattern: str) -> re.Match[str]:
        """The first line of `name` matching `pattern`; fails if the process exits or `start_timeout_s` passes."""
        regex = re.compile(pattern)
        async with asyncio.timeout(self.start_timeout_s), self._arrived:
            while True:
                for line in self.lines[name]:
                    if match := regex.search(line):
                        return match
                if self.proc.returncode is not None or all(task.done() for task in self._readers):
                    pytest.fail(f"exited ({self.proc.returncode}) before printing {pattern!r}:\n{self.output()}")
                await self._arrived.wait()

    def records(self, name: str, message: str) -> list[dict[str, Any]]:
        """The JSON log records printed so far on `name` whose `msg` is `message` (other lines are skipped)."""
        found = []
        for line in self.lines[name]:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("msg") == message:
                    found.append(record)
        return found

    async def wait_for_record(self, name: str, message: str) -> dict[str, Any]:
        """The first JSON log record on `name` whose `msg` is `message` (bounded; fails if the process exits)."""
        async with asyncio.timeout(self.start_timeout_s), self._arrived:
            while True:
                if found := self.records(name, message):
                    return found[0]
                if self.proc.returncode is not None or all(task.done() for task in self._readers):
                    pytest.fail(f"exited ({self.proc.returncode}) before logging {message!r}:\n{self.output()}")
                await self._arrived.wait()

    async def stop(self, signum: signal.Signals = signal.SIGTERM) -> int:
        """Send `signum` and wait (bounded) for the exit code."""
        self.proc.send_signal(signum)
        return await self.exit_code()

    async def exit_code(self) -> int:
        """The exit code once the process has ended on its own (bounded), all its output collected."""
        async with asyncio.timeout(self.exit_timeout_s):
            code = await self.proc.wait()
            await asyncio.gather(*self._readers)
        return code

    def output(self) -> str:
        return "\n".join(["-- stdout --", *self.lines["stdout"], "-- stderr --", *self.lines["stderr"]])

    async def aclose(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        for task in self._readers:
            task.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)


@contextlib.asynccontextmanager
async def cli(
    *args: str,
    env: dict[str, str] | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
    exit_timeout_s: float = EXIT_TIMEOUT_S,
) -> AsyncIterator[Cli]:
    """The command with `args`, killed at the end if still running. Its environment: `env`, by default one that
    puts the admin listener on a free port (MCP_SIDECAR__ADMIN__PORT=0) unless `args` name one."""
    env = cli_env(MCP_SIDECAR__ADMIN__PORT="0") if env is None else env
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sidecar.cli", *args, cwd=REPO_ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    process = Cli(proc, start_timeout_s, exit_timeout_s)
    try:
        yield process
    finally:
        await process.aclose()
