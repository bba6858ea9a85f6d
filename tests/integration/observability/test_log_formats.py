"""Which log format `mcp-sidecar run` writes, as a real process: text lines at a terminal, JSON lines into a pipe
(either chosen by `--log-format` or `logging.format`), and a configuration line that masks only the secrets."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.kit.cli import REPO_ROOT, START_TIMEOUT_S, Cli, cli, cli_env

UNREACHABLE = "http://127.0.0.1:9/mcp"
"""Nothing answers there: the sidecar starts (and logs) all the same, with no peer to start."""
TEXT_LINE = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO|WARNING|ERROR) +\S"
SUMMARY_MAX_CHARS = 300
"""The configuration line in text: a short summary, not the whole configuration."""
API_KEY = "k3y-s3cr3t"


def _config(tmp_path: Path, redis_url: str = "redis://127.0.0.1:6379/0", logging: str = "") -> Path:
    path = tmp_path / "sidecar.yaml"
    path.write_text(
        f"upstream:\n  url: {UNREACHABLE}\n  headers:\n    x-api-key: {API_KEY}\n"
        f"listen:\n  port: 0\nbus:\n  redis_url: '{redis_url}'\n{logging}",
        encoding="utf-8",
    )
    return path


ADMIN_URL = r'admin(?:=|": ?")(http://[^"\s]+)'
LISTENING = "mcp-sidecar listening.*" + ADMIN_URL
"""The "mcp-sidecar listening" line, JSON or text, and in it the admin URL."""


async def _logged_until_listening(*args: str) -> list[str]:
    """The stderr lines of `run ARGS` from its start to its clean exit after SIGTERM, once it serves."""
    async with cli("run", *args) as run:
        listening = await run.wait_for_line("stderr", LISTENING)
        # An answer from the admin listener: the process is past its start-up, its signal handlers in place.
        async with aiohttp.ClientSession() as http, http.get(listening.group(1)) as response:
            assert response.status == 200
        assert await run.stop(signal.SIGTERM) == 0, run.output()
    return _lines(run)


def _lines(run: Cli) -> list[str]:
    return [line for line in run.lines["stderr"] if line]


def _json_entries(lines: list[str]) -> list[dict[str, Any]]:
    entries = [json.loads(line) for line in lines]  # each line one JSON object, or this fails
    assert entries and all(isinstance(entry, dict) for entry in entries)
    return entries


def _assert_text(lines: list[str]) -> None:
    assert lines
    for line in lines:
        assert re.match(TEXT_LINE, line), f"not a text log line: {line!r}"
    summary = next(line for line in lines if " configuration  " in line)
    assert len(summary) <= SUMMARY_MAX_CHARS, summary
    for field in ("upstream=", "listen=", "admin=", "bus="):
        assert field in summary, summary


async def test_into_a_pipe_the_default_is_json_lines(tmp_path: Path) -> None:
    entries = _json_entries(await _logged_until_listening("--config", str(_config(tmp_path))))
    assert "mcp-sidecar listening" in {entry["msg"] for entry in entries}


@pytest.mark.parametrize(
    ("flags", "logging"),
    [(["--log-format", "text"], ""), ([], "logging:\n  format: text\n")],
    ids=["flag", "config-key"],
)
async def test_text_chosen_gives_text_lines_into_a_pipe_too(tmp_path: Path, flags: list[str], logging: str) -> None:
    _assert_text(await _logged_until_listening("--config", str(_config(tmp_path, logging=logging)), *flags))


def _run_at_a_terminal(*args: str) -> list[str]:
    """`run ARGS` with its stderr on a pseudo-terminal, as when started by hand: its lines until it listens,
    then SIGTERM and the rest until it exits."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar.cli", "run", *args],
        cwd=REPO_ROOT,
        env=cli_env(MCP_SIDECAR__ADMIN__PORT="0"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=follower,
    )
    os.close(follower)
    received = b""
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while (listening := re.search(LISTENING, received.decode(errors="replace"))) is None:
            assert time.monotonic() < deadline and proc.poll() is None, received.decode(errors="replace")
            if select.select([leader], [], [], 0.5)[0]:
                received += os.read(leader, 65536)
        with urllib.request.urlopen(listening.group(1), timeout=START_TIMEOUT_S) as response:  # past start-up
            assert response.status == 200
        proc.send_signal(signal.SIGTERM)
        while True:  # until the terminal's other end is closed: EOF, or EIO on Linux
            try:
                chunk = os.read(leader, 65536) if select.select([leader], [], [], START_TIMEOUT_S)[0] else b""
            except OSError:
                break
            if not chunk:
                break
            received += chunk
        assert proc.wait(timeout=START_TIMEOUT_S) == 0, received.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    return [line for line in received.decode(errors="replace").replace("\r\n", "\n").split("\n") if line]


def test_at_a_terminal_the_default_is_text(tmp_path: Path) -> None:
    _assert_text(_run_at_a_terminal("--config", str(_config(tmp_path))))


def test_at_a_terminal_json_chosen_gives_json(tmp_path: Path) -> None:
    entries = _json_entries(_run_at_a_terminal("--config", str(_config(tmp_path)), "--log-format", "json"))
    assert "configuration" in {entry["msg"] for entry in entries}


@pytest.mark.parametrize(
    ("redis_url", "shown"),
    [
        ("redis://:hunter2@db.internal:6379/0", "redis://:***@db.internal:6379/0"),
        ("redis://db.internal:6379/0", "redis://db.internal:6379/0"),
    ],
    ids=["password", "no-password"],
)
@pytest.mark.parametrize("log_format", ["json", "text"])
async def test_the_configuration_line_masks_only_secrets(
    tmp_path: Path, redis_url: str, shown: str, log_format: str
) -> None:
    config = _config(tmp_path, redis_url=redis_url)
    lines = await _logged_until_listening("--config", str(config), "--log-level", "debug", "--log-format", log_format)
    everything = "\n".join(lines)
    assert "hunter2" not in everything and API_KEY not in everything
    if log_format == "json":
        (configuration,) = [entry for entry in _json_entries(lines) if entry["msg"] == "configuration"]
        assert configuration["config"]["bus"]["redis_url"] == shown
        assert configuration["config"]["upstream"]["headers"] == {"x-api-key": "**********"}
        assert configuration["config"]["upstream"]["url"] == UNREACHABLE
    else:
        _assert_text(lines)
        (effective,) = [line for line in lines if " effective configuration  config=" in line]
        assert f'"redis_url":"{shown}"' in effective, effective
