"""The `mcp-sidecar` command as a real process: check-config, demo and run, started and stopped as an operator would."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from sidecar.config import SidecarConfig
from sidecar.config.shown import shown_config
from tests.kit import rpc
from tests.kit.cli import EXIT_TIMEOUT_S, START_TIMEOUT_S
from tests.kit.cli import cli as _cli
from tests.kit.cli import cli_env as _env
from tests.peers import Upstream

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "config" / "sidecar.example.yaml"


def _check_config(path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "check-config", str(path)],
        cwd=REPO_ROOT,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sidecar.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# -- check-config ------------------------------------------------------------------------------------------


def test_check_config_piped_into_a_reader_that_stops_early_exits_quietly() -> None:
    # `mcp-sidecar check-config FILE | head -1`: the reader closes the pipe after one line.
    reader = subprocess.Popen(["head", "-c", "1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    writer = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "check-config", str(EXAMPLE)],
        cwd=REPO_ROOT,
        env=_env(),
        stdout=reader.stdin,
        stderr=subprocess.PIPE,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )
    assert reader.stdin is not None
    reader.stdin.close()
    reader.wait(timeout=START_TIMEOUT_S)
    assert writer.returncode == 0 and writer.stderr == ""


def test_check_config_warns_when_a_header_declared_non_identifying_looks_like_an_identity(tmp_path: Path) -> None:
    # Declared non-identifying, X-Tenant-Id would let clients of different tenants share cached answers and
    # watches: the file is valid (the operator may mean it), but the warning names the key and the risk.
    text = (
        "upstream:\n  url: http://127.0.0.1:9/mcp\n"
        "  forward_headers: [authorization, x-tenant-id, traceparent]\n"
        "  non_identity_headers: [x-tenant-id, traceparent]\n"
    )
    done = _check_config(_write(tmp_path, text))
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, done.stderr
    assert "upstream.non_identity_headers: 'x-tenant-id' looks like it identifies the client" in warnings[0]


@pytest.mark.parametrize(
    ("text", "env", "named"),
    [
        pytest.param("polling:\n  intervl: 5000\n", {}, "polling.intervl: unknown key", id="misspelt-key"),
        pytest.param("listen:\n  port: x\n", {}, "listen.port: ", id="bad-value"),
        pytest.param(
            "polling:\n  min_interval_ms: 900\n  max_interval_ms: 100\n",
            {},
            "min_interval_ms (900) must not exceed max_interval_ms (100)",
            id="min-above-max",
        ),
        pytest.param(
            "upstream:\n  timeout_s: 5\n",
            {"MCP_SIDECAR__UPSTREAM__TIMEOUT_S": "soon"},
            "upstream.timeout_s: ",
            id="bad-env-override",
        ),
        pytest.param("listen:\n  port: 0\n", {}, "upstream: neither url nor command is set", id="no-upstream"),
        pytest.param(
            "upstream:\n  url: http://127.0.0.1:9/mcp\n  command: [uvx, mcp-server-time]\n",
            {},
            "upstream: url and command are both set",
            id="url-and-command",
        ),
    ],
)
def test_check_config_rejects_a_bad_file_naming_the_key(
    tmp_path: Path, text: str, env: dict[str, str], named: str
) -> None:
    done = _check_config(_write(tmp_path, text), **env)
    assert done.returncode == 1
    assert named in done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr


def test_check_config_on_a_missing_file_says_so(tmp_path: Path) -> None:
    done = _check_config(tmp_path / "nope.yaml")
    assert done.returncode == 1
    assert "nope.yaml: cannot read" in done.stderr


def test_check_config_accepts_the_example_and_prints_the_defaults() -> None:
    done = _check_config(EXAMPLE)
    assert done.returncode == 0, done.stderr
    defaults = SidecarConfig.model_validate({"upstream": {"url": "http://127.0.0.1:9000/mcp"}})
    printed = json.loads(done.stdout)
    assert printed == shown_config(defaults)
    # Only secrets are masked: a Redis URL without a password is shown whole.
    assert printed["bus"]["redis_url"] == "redis://127.0.0.1:6379/0"


def test_check_config_applies_environment_overrides(tmp_path: Path) -> None:
    text = "upstream:\n  url: http://127.0.0.1:9/mcp\n  timeout_s: 30\n"
    done = _check_config(_write(tmp_path, text), MCP_SIDECAR__UPSTREAM__TIMEOUT_S="7.5")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["upstream"]["timeout_s"] == 7.5


def test_check_config_never_prints_secrets(tmp_path: Path) -> None:
    text = (
        "upstream:\n  url: http://127.0.0.1:9/mcp\n  headers:\n    x-api-key: s3cret-api-key\n"
        "bus:\n  redis_url: redis://:hunter2@db:6379/0\n"
    )
    done = _check_config(_write(tmp_path, text))
    assert done.returncode == 0, done.stderr
    assert "x-api-key" in done.stdout
    assert "s3cret-api-key" not in done.stdout + done.stderr
    assert "hunter2" not in done.stdout + done.stderr


# -- long-running commands ---------------------------------------------------------------------------------


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize(
    "host",
    [
        pytest.param("127.0.0.1", id="ipv4"),
        pytest.param("::1", id="ipv6", marks=pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback")),
    ],
)
async def test_demo_serves_a_changing_catalog_and_stops_on_ctrl_c(host: str, http: aiohttp.ClientSession) -> None:
    async with _cli("demo", "--host", host, "--port", "0") as demo:
        url = (await demo.wait_for_line("stdout", r"^mcp-sidecar .*?(http://\S+/mcp)$")).group(1)
        status, discover = await rpc(http, url, "server/discover")
        assert status == 200, demo.output()
        assert discover["result"]["supportedVersions"] == ["2026-07-28"]
        assert discover["result"]["_meta"]["io.github.mcp-sidecar/upstreamServerInfo"]["name"] == "demo-catalog"
        status, read = await rpc(http, url, "resources/read", {"uri": "catalog://plans/basic"})
        assert status == 200, demo.output()
        assert re.fullmatch(r"price=\d+", read["result"]["contents"][0]["text"])
        # The re-read line the demo prints works as printed (the README shows the same).
        reread = (await demo.wait_for_line("stdout", r"^curl -s .*resources/read.*$")).group(0)
        shell = await asyncio.create_subprocess_shell(reread, stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(shell.communicate(), START_TIMEOUT_S)
        assert re.fullmatch(r"price=\d+", json.loads(out)["result"]["contents"][0]["text"]), out
        assert await demo.stop(signal.SIGINT) == 0, demo.output()
    assert "Traceback" not in demo.output()


async def test_run_serves_the_configured_upstream_and_stops_on_sigterm(
    tmp_path: Path, modern_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    path = _write(tmp_path, f"upstream:\n  url: {modern_upstream.url}\nlisten:\n  port: 0\nlogging:\n  format: json\n")
    async with _cli("run", "--config", str(path)) as run:
        line = (await run.wait_for_line("stderr", r'"msg": ?"mcp-sidecar listening"')).string
        url = json.loads(line)["url"]
        status, reply = await rpc(http, url, "resources/read", {"uri": "catalog://price"})
        assert status == 200, run.output()
        assert reply["result"]["contents"][0]["text"] == "price=100"
        assert await run.stop(signal.SIGTERM) == 0, run.output()
    assert "Traceback" not in run.output()


async def test_run_flags_given_before_the_subcommand_apply(
    modern_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    async with _cli("--upstream", modern_upstream.url, "--port", "0", "--log-level", "info", "run") as run:
        line = (await run.wait_for_line("stderr", r'"msg": ?"mcp-sidecar listening"')).string
        assert json.loads(line)["upstream"] == modern_upstream.url
        status, reply = await rpc(http, json.loads(line)["url"], "tools/list")
        assert status == 200, run.output()
        assert "echo" in {tool["name"] for tool in reply["result"]["tools"]}
        assert await run.stop(signal.SIGTERM) == 0, run.output()


async def test_run_on_a_port_in_use_exits_1_saying_why(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = _write(tmp_path, f"upstream:\n  url: http://127.0.0.1:9/mcp\nlisten:\n  port: {port}\n")
        async with _cli("run", "--config", str(path)) as run:
            await run.wait_for_line("stderr", rf"cannot listen on 127\.0\.0\.1:{port}")
            async with asyncio.timeout(EXIT_TIMEOUT_S):
                assert await run.proc.wait() == 1
