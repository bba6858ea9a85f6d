"""The configuration checks that guard scale-out, run as `mcp-sidecar run`: workers without Redis, an unreachable
or unknown Redis at start (exit 1 naming the key), local fallback starting degraded; and the Redis client the
app imports is one the test command installs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import aiohttp

from tests.cluster import (
    Replica,
    free_port,
    sidecar_config,
    write_config,
)
from tests.kit import ListenStream, cli, cli_env
from tests.peers import Upstream

URI = "catalog://price"
NOTIFY_WITHIN_S = 10.0
"""Generous bound for a change to reach a stream (an interval, a lease period and a hop through Redis)."""


async def _run_to_exit(tmp_path: Path, config: dict[str, Any], *args: str) -> tuple[int, str]:
    path = write_config(tmp_path / "sidecar.yaml", config)
    async with cli("run", "--config", str(path), *args, env=cli_env(), exit_timeout_s=20) as run:
        code = await run.exit_code()
    return code, run.output()


async def test_workers_with_the_memory_bus_exit_1_naming_bus_backend(tmp_path: Path) -> None:
    config = sidecar_config("http://127.0.0.1:9/mcp", free_port(), bus={"backend": "memory"})
    code, output = await _run_to_exit(tmp_path, config, "--workers", "2")
    assert code == 1, output
    assert "bus.backend" in output and "redis" in output, output
    assert "Traceback" not in output


async def test_unreachable_redis_at_start_exits_1_saying_so(tmp_path: Path, shop: Upstream) -> None:
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    code, output = await _run_to_exit(tmp_path, sidecar_config(shop.url, free_port(), nobody))
    assert code == 1, output
    assert "cannot reach Redis at bus.redis_url" in output and "bus.fallback: local" in output, output
    assert "Traceback" not in output


async def test_a_redis_url_of_an_unknown_scheme_exits_1_naming_bus_redis_url(tmp_path: Path) -> None:
    config = sidecar_config("http://127.0.0.1:9/mcp", free_port(), "http://:secret-pw@127.0.0.1:6379/0")
    code, output = await _run_to_exit(tmp_path, config)
    assert code == 1, output
    assert "bus.redis_url" in output and "unknown scheme" in output, output
    assert "Traceback" not in output and "secret-pw" not in output


async def test_unreachable_redis_with_local_fallback_starts_degraded(tmp_path: Path, shop: Upstream) -> None:
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    config = sidecar_config(shop.url, free_port(), nobody, bus={"fallback": "local"})
    sidecar = Replica("fallback", tmp_path / "fallback", config)
    try:
        await sidecar.start()
        status, body = await sidecar.readyz()
        assert status == 200 and "degraded" in body, body
        assert (await sidecar.metrics()).total("mcp_sidecar_redis_up") == 0
        async with aiohttp.ClientSession() as http:  # and it works, on its own
            stream = await ListenStream.connect(http, sidecar.url, "alone", [URI])
            try:
                await shop.set_price(190)
                await stream.wait_update(URI, NOTIFY_WITHIN_S)
            finally:
                await stream.aclose()
    finally:
        assert await sidecar.service.stop() == 0, sidecar.service.log_tail()


def test_the_redis_client_the_app_imports_is_installed_by_the_test_command() -> None:
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    # The README's test command installs the package with its `test` extra (and .ci/run also `dev`).
    installed = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    assert any(re.match(r"redis\b", requirement) for requirement in installed), installed
