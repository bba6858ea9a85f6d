"""What `check-config` and `run` tell an operator about a file that loads but contradicts itself, or a key that is
not one: as a real process, from the file and from the environment."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kit.cli import REPO_ROOT, START_TIMEOUT_S, cli, cli_env

_BELOW_MINIMUM = "polling.default_interval_ms{origin} is 100, below polling.min_interval_ms of 250"


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sidecar.yaml"
    path.write_text("upstream:\n  url: http://127.0.0.1:9/mcp\nlisten:\n  port: 0\n" + text, encoding="utf-8")
    return path


_SOURCES = pytest.mark.parametrize(
    ("text", "env", "origin"),
    [
        pytest.param("polling:\n  default_interval_ms: 100\n", {}, "", id="from-the-file"),
        pytest.param(
            "",
            {"MCP_SIDECAR__POLLING__DEFAULT_INTERVAL_MS": "100"},
            " (from MCP_SIDECAR__POLLING__DEFAULT_INTERVAL_MS)",
            id="from-the-environment",
        ),
    ],
)


def _check_config(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "check-config", str(path)],
        cwd=REPO_ROOT,
        env=cli_env(**env),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )


@_SOURCES
def test_check_config_warns_of_a_default_interval_below_the_minimum(
    tmp_path: Path, text: str, env: dict[str, str], origin: str
) -> None:
    done = _check_config(_file(tmp_path, text), env)
    assert done.returncode == 0, done.stderr
    assert f"mcp-sidecar: warning: {_BELOW_MINIMUM.format(origin=origin)}" in done.stderr


@_SOURCES
async def test_run_warns_of_a_default_interval_below_the_minimum_at_start(
    tmp_path: Path, text: str, env: dict[str, str], origin: str
) -> None:
    path = _file(tmp_path, text)
    async with cli(
        "run", "--config", str(path), "--log-format", "json", env=cli_env(MCP_SIDECAR__ADMIN__PORT="0", **env)
    ) as run:
        record = json.loads((await run.wait_for_line("stderr", r'"level": ?"warning".*default_interval_ms')).string)
        assert record["msg"].startswith(_BELOW_MINIMUM.format(origin=origin)), run.output()
        assert await run.stop(signal.SIGTERM) == 0, run.output()


def test_check_config_suggests_the_key_a_misspelt_one_was_meant_to_be(tmp_path: Path) -> None:
    done = _check_config(_file(tmp_path, "polling:\n  default_intervl_ms: 5\n"), {})
    assert done.returncode == 1
    assert "mcp-sidecar: polling.default_intervl_ms: unknown key; did you mean 'default_interval_ms'?" in done.stderr
    assert "Traceback" not in done.stderr
