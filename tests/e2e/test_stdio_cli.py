"""`mcp-sidecar run --upstream "<stdio command>"` as a real process: both client eras served, SIGTERM leaves no
process of the child behind (checked in the process table), a command behind a launcher that must reach its
registry gets what it needs (or the log says what it lacked), and a failed first start decides no era."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp import Client
from mcp.client.subscriptions import ResourceUpdated

from sidecar.upstream.stdio.process import REACH_ENVIRONMENT
from tests.kit import Cli, cli, cli_env, eventually, rpc, scrape
from tests.peers.stdio_notes_server import NOTE_URI
from tests.peers.stdio_peers import (
    REPO_ROOT,
    launcher_command,
    live_processes,
    notes_command,
    session_members,
    session_of,
    time2_command,
    toy_command,
)

START_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 15.0


@contextlib.asynccontextmanager
async def _run(*args: str, environ: Mapping[str, str] | None = None) -> AsyncIterator[Cli]:
    """`mcp-sidecar run ARGS` with this environment (or `environ`), less any MCP_SIDECAR__ settings of its own."""
    env = cli_env(environ)
    async with cli("run", *args, env=env, start_timeout_s=START_TIMEOUT_S, exit_timeout_s=EXIT_TIMEOUT_S) as run:
        yield run


async def _listening(run: Cli) -> dict[str, Any]:
    return await run.wait_for_record("stderr", "mcp-sidecar listening")


async def _url(run: Cli) -> str:
    url: str = (await _listening(run))["url"]
    return url


async def _admin_url(run: Cli) -> str:
    """The admin listener's base URL (/status, /metrics)."""
    metrics_url: str = (await _listening(run))["admin"]
    return metrics_url.removesuffix("/metrics")


async def test_run_with_a_command_serves_both_eras_and_sigterm_leaves_no_process(tmp_path: Path) -> None:
    note = tmp_path / "note.txt"
    note.write_text("first", encoding="utf-8")
    command = shlex.join(notes_command(note, read_ttl_ms=300))
    async with _run("--upstream", command, "--port", "0") as run:
        url = await _url(run)
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
        assert await run.stop() == 0, run.output()
    assert live_processes([server_pid]) == []
    assert not any("Traceback" in line for line in run.lines["stderr"])


async def test_sigterm_reaches_every_process_of_a_wrapper_chain(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    pids = tmp_path / "pids"
    # sh (not exec'd) starts a python wrapper that ignores SIGTERM and forwards nothing, which starts the server.
    chain = shlex.join(toy_command("--wrapper", "--pid-file", str(pids))) + "; true"
    async with _run("--upstream", shlex.join(["sh", "-c", chain]), "--port", "0") as run:
        url = await _url(run)
        status, reply = await rpc(http, url, "tools/call", {"name": "pid", "arguments": {}})
        assert status == 200, reply
        wrapper, server = (int(line) for line in pids.read_text().split())
        shell = session_of(server)  # sh leads the session (and the process group) the sidecar gave the child
        assert set(session_members(shell)) == {shell, wrapper, server}
        assert await run.stop() == 0, run.output()
    assert live_processes([shell, wrapper, server]) == []


async def test_a_command_that_cannot_start_exits_1_saying_why() -> None:
    async with _run("--upstream", "/nonexistent/mcp-server --stdio", "--port", "0") as run:
        assert await run.exit_code() == 1
    assert any(
        "upstream.command: cannot start '/nonexistent/mcp-server': No such file or directory" in line
        for line in run.lines["stderr"]
    ), run.lines["stderr"]


PROXY_AND_CA = {
    "HTTPS_PROXY": "http://127.0.0.1:3128",
    "NO_PROXY": "127.0.0.1,localhost",
    "SSL_CERT_FILE": "/etc/ssl/private-ca.pem",
    "REQUESTS_CA_BUNDLE": "/etc/ssl/private-ca.pem",
    "NODE_EXTRA_CA_CERTS": "/etc/ssl/private-ca.pem",
    "UV_INDEX_URL": "https://pypi.internal.example/simple",
}
"""What an operator behind a proxy with a private CA exports before starting the sidecar."""


def _environ_without_proxy_or_ca(**extra: str) -> dict[str, str]:
    """This environment, as on a host with no proxy and the system CA, plus `extra`."""
    return {**{k: v for k, v in os.environ.items() if k not in REACH_ENVIRONMENT}, **extra}


def _config_file(tmp_path: Path, upstream: str = "") -> str:
    path = tmp_path / "sidecar.yaml"
    path.write_text(
        "upstream:\n  url: http://127.0.0.1:9/mcp  # replaced by --upstream\n  restart_backoff_initial_ms: 100\n"
        f"{upstream}admin:\n  port: 0\n",
        encoding="utf-8",
    )
    return str(path)


async def test_a_command_behind_a_proxy_gets_the_proxy_and_ca_variables_and_those_named_with_upstream_env(
    tmp_path: Path,
) -> None:
    needs = [*PROXY_AND_CA, "REGISTRY_TOKEN", "LAUNCH_MODE", "TEAM_INDEX_KEY"]
    command = shlex.join(launcher_command(time2_command(), require=needs))
    environ = _environ_without_proxy_or_ca(**PROXY_AND_CA, REGISTRY_TOKEN="t0ken", TEAM_INDEX_KEY="k3y")
    config = _config_file(tmp_path, "  inherit_env: [TEAM_INDEX_KEY]\n")  # the flags add to the file's names
    args = ("--upstream", command, "--config", config)
    more = ("--upstream-env", "REGISTRY_TOKEN", "--upstream-env", "LAUNCH_MODE=offline")
    async with _run(*args, *more, environ=environ) as run:
        async with Client(await _url(run), cache=None) as client:
            assert "get_current_time" in [tool.name for tool in (await client.list_tools()).tools]
        assert run.records("stderr", "stdio server down") == []  # served at its first start
        assert await run.stop() == 0, run.output()


def _run_to_its_end(*args: str) -> subprocess.CompletedProcess[str]:
    """`mcp-sidecar run ARGS` that is expected to exit at once (a refused flag or configuration)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("MCP_SIDECAR__")}
    command = [sys.executable, "-m", "sidecar.cli", "run", *args]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=EXIT_TIMEOUT_S)


@pytest.mark.parametrize(
    ("flag", "problem"),
    [
        pytest.param("HTTPS-PROXY", "'HTTPS-PROXY' is not an environment variable name", id="bad-name"),
        pytest.param("=value", "'' is not an environment variable name", id="no-name"),
    ],
)
def test_upstream_env_refuses_what_is_not_a_variable_name(flag: str, problem: str) -> None:
    done = _run_to_its_end("--upstream", "server", "--upstream-env", flag)
    assert done.returncode == 2 and problem in done.stderr, done.stderr


def test_upstream_env_with_an_http_upstream_is_refused_naming_the_key() -> None:
    done = _run_to_its_end("--upstream", "http://127.0.0.1:9/mcp", "--upstream-env", "GITHUB_TOKEN")
    assert done.returncode == 1 and "upstream.inherit_env is for upstream.command" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


async def test_a_command_that_exits_before_its_handshake_is_logged_with_its_stderr_and_the_unset_variables(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    needs = ["HTTPS_PROXY", "SSL_CERT_FILE", "REGISTRY_TOKEN"]
    command = shlex.join(launcher_command(time2_command(), require=needs))
    environ = _environ_without_proxy_or_ca(SSL_CERT_FILE="/etc/ssl/private-ca.pem", REGISTRY_TOKEN="t0ken")
    # REGISTRY_TOKEN is in the sidecar's environment but not named: the command does not get it.
    async with _run("--upstream", command, "--config", _config_file(tmp_path), environ=environ) as run:
        admin = await _admin_url(run)
        await eventually(lambda: bool(run.records("stderr", "stdio server down")), within_s=START_TIMEOUT_S)
        down = run.records("stderr", "stdio server down")[0]
        assert down["before_handshake"] is True
        assert down["stderr_tail"] == [
            "launcher: resolving the server package",
            "launcher: error: cannot reach the registry: HTTPS_PROXY, REGISTRY_TOKEN not set",
        ]
        assert "HTTPS_PROXY" in down["unset_env"] and "https_proxy" in down["unset_env"]
        assert "SSL_CERT_FILE" not in down["unset_env"]  # passed: it was set
        assert "exited with code 2" in down["reason"] and "not set" in down["reason"]
        assert "--upstream-env" in down["hint"]
        async with http.get(f"{admin}/status") as resp:
            status = await resp.json()
        assert status["ready"] is False and "exited with code 2" in status["upstream"]["not_ready_reason"]
        assert await run.stop() == 0, run.output()


async def test_a_command_that_fails_its_first_start_is_driven_in_its_own_era_after_the_restart(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    note, marker = tmp_path / "note.txt", tmp_path / "first-start-failed"
    note.write_text("first", encoding="utf-8")
    command = shlex.join(launcher_command(notes_command(note), fail_first=marker))
    async with _run("--upstream", command, "--config", _config_file(tmp_path)) as run:
        admin = await _admin_url(run)

        async def status() -> dict[str, Any]:
            async with http.get(f"{admin}/status") as resp:
                body: dict[str, Any] = await resp.json()
                return body

        async def up() -> bool:
            return (await status())["upstream"]["up"] is True

        await eventually(up, within_s=START_TIMEOUT_S)
        assert marker.exists() and len(run.records("stderr", "stdio server down")) == 1  # the first start did fail
        assert (await status())["upstream"]["era"] == "2026-07-28"
        metrics = await scrape(http, admin)
        assert metrics.value("mcp_sidecar_upstream_era_info", era="2026-07-28") == 1
        assert metrics.value("mcp_sidecar_upstream_era_info", era="2025-11-25") == 0
        async with Client(await _url(run), cache=None) as client:
            assert (await client.read_resource(NOTE_URI)).contents[0].text == "first"  # type: ignore[union-attr]
        assert await run.stop() == 0, run.output()
