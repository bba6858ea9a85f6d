"""Stdio MCP servers for the tests, as commands the sidecar starts, and a sidecar in front of one.

Third-party servers come from `.tools/` (`bash .ci/install-peers`): the npm reference server
(`server-everything`, stdio mode), the npm `server-memory` (a knowledge graph in a JSONL file) and
`server-postgres` (a PostgreSQL database's table schemas), all on Node 22, and the 1.x-era `mcp-server-time`
in its own venv; a test that needs one skips, naming that script, when it is missing. The 2026-era
`mcp-server-time` and our own servers (`stdio_notes_server`, SDK 2.3; `stdio_toy_server`, hand-written) run
on this Python.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from sidecar.config import SidecarConfig
from tests.kit import Sidecar, serve_config
from tests.prereqs import skip_missing

__all__ = [
    "MEMORY_VERSION",
    "POSTGRES_VERSION",
    "REPO_ROOT",
    "everything_command",
    "installed_version",
    "launcher_command",
    "live_processes",
    "memory_command",
    "notes_command",
    "postgres_command",
    "serve_stdio_sidecar",
    "session_members",
    "session_of",
    "stdio_config",
    "time1_command",
    "time2_command",
    "toy_command",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS = REPO_ROOT / ".tools"
NODE = TOOLS / "node22" / "node_modules" / ".bin" / "node"
EVERYTHING = TOOLS / "server-everything" / "node_modules" / "@modelcontextprotocol" / "server-everything"
MEMORY = TOOLS / "server-memory" / "node_modules" / "@modelcontextprotocol" / "server-memory"
POSTGRES = TOOLS / "server-postgres" / "node_modules" / "@modelcontextprotocol" / "server-postgres"
MEMORY_VERSION = "2026.8.31"
"""The versions .ci/install-peers pins (tests/compat/test_stdio_servers.py checks the installed ones)."""
POSTGRES_VERSION = "0.6.2"
TIME1_PYTHON = TOOLS / "venv-mcp1" / "bin" / "python"
_INSTALL = "run `bash .ci/install-peers` to install it under .tools/"


def _require(path: Path, what: str) -> None:
    if not path.exists():
        skip_missing(f"{what} is not installed ({path} is missing); {_INSTALL}")


def everything_command() -> list[str]:
    """`@modelcontextprotocol/server-everything` (npm, pinned by .ci/install-peers) in stdio mode."""
    _require(NODE, "Node 22")
    _require(EVERYTHING / "dist" / "index.js", "@modelcontextprotocol/server-everything")
    return [str(NODE), str(EVERYTHING / "dist" / "index.js"), "stdio"]


def memory_command() -> list[str]:
    """`@modelcontextprotocol/server-memory` (npm, pinned by .ci/install-peers): its graph lives in the file
    that the environment variable `MEMORY_FILE_PATH` names (pass it in `upstream.env`)."""
    _require(NODE, "Node 22")
    _require(MEMORY / "dist" / "index.js", "@modelcontextprotocol/server-memory")
    return [str(NODE), str(MEMORY / "dist" / "index.js")]


def postgres_command(database_url: str) -> list[str]:
    """`@modelcontextprotocol/server-postgres` (npm, pinned by .ci/install-peers) on `database_url`, passed on its
    command line as its README does (a password included)."""
    _require(NODE, "Node 22")
    _require(POSTGRES / "dist" / "index.js", "@modelcontextprotocol/server-postgres")
    return [str(NODE), str(POSTGRES / "dist" / "index.js"), database_url]


def installed_version(command: list[str]) -> str:
    """The npm package version of the server `command` runs (from its package.json beside dist/)."""
    package = Path(command[1]).parents[1] / "package.json"
    version: str = json.loads(package.read_text(encoding="utf-8"))["version"]
    return version


def time1_command() -> list[str]:
    """`mcp-server-time` 2025.9.25 on the 1.x SDK: a 2025-11-25-only stdio server, from its own venv."""
    _require(TIME1_PYTHON, "the 1.x SDK venv with mcp-server-time")
    return [str(TIME1_PYTHON), "-m", "mcp_server_time"]


def time2_command() -> list[str]:
    """`mcp-server-time` 2026.10.19 on the SDK 2.3 (the test extra): a 2026-07-28 stdio server."""
    if importlib.util.find_spec("mcp_server_time") is None:
        skip_missing("mcp-server-time 2026.10.19 is not installed (pip install -e '.[test]')")
    return [sys.executable, "-m", "mcp_server_time"]


def notes_command(path: Path, read_ttl_ms: int = 1000, *, write_lag_ms: int = 0, announce: bool = False) -> list[str]:
    """Our SDK 2.3 stdio server whose resource `notes://current` is the file at `path` (`write_lag_ms`: its
    `write_note` shows that much later; `announce`: it then sends `resources/updated` undeclared)."""
    return [
        sys.executable, "-m", "tests.peers.stdio_notes_server", "--file", str(path), "--read-ttl-ms", str(read_ttl_ms),
        "--write-lag-ms", str(write_lag_ms), *(["--announce"] if announce else []),
    ]  # fmt: skip


def toy_command(*flags: str) -> list[str]:
    """The hand-written 2025-11-25 server, with its misbehaviour flags (see stdio_toy_server)."""
    return [sys.executable, "-m", "tests.peers.stdio_toy_server", *flags]


def launcher_command(server: list[str], *, require: Sequence[str] = (), fail_first: Path | None = None) -> list[str]:
    """`server` behind a launcher that, as uvx or npx does, must reach a registry first (see stdio_launcher)."""
    flags = [item for name in require for item in ("--require", name)]
    if fail_first is not None:
        flags += ["--fail-first", str(fail_first)]
    return [sys.executable, "-m", "tests.peers.stdio_launcher", *flags, "--", *server]


def stdio_config(command: list[str], **sections: dict[str, Any]) -> SidecarConfig:
    upstream = {"command": command, "cwd": str(REPO_ROOT), **sections.pop("upstream", {})}
    data: dict[str, Any] = {"upstream": upstream, "listen": {"port": 0}, "logging": {"format": "text"}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return SidecarConfig.model_validate(data)


@contextlib.asynccontextmanager
async def serve_stdio_sidecar(command: list[str], **sections: dict[str, Any]) -> AsyncIterator[Sidecar]:
    """The sidecar app on 127.0.0.1 with `command` as its upstream; leaving stops both (the child's group too)."""
    async with serve_config(stdio_config(command, **sections)) as sidecar:
        yield sidecar


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def session_members(session: int) -> list[int]:
    """Live (not zombie) processes of the session `session` (a child started with start_new_session leads one)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[3]) == session and fields[0] != "Z":
                members.append(int(entry.name))
    return sorted(members)


def session_of(pid: int) -> int:
    """The session id of a live process."""
    fields = _stat(pid)
    assert fields is not None, f"process {pid} is gone"
    return int(fields[3])


def live_processes(pids: list[int]) -> list[int]:
    """Those of `pids` still alive (a zombie, dead and waiting to be reaped, is not)."""
    alive = []
    for pid in pids:
        fields = _stat(pid)
        if fields is not None and fields[0] != "Z":
            alive.append(pid)
    return alive
