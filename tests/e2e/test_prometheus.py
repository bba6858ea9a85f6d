"""The sidecar as Prometheus sees it: promtool accepts its scrape and the alert rules, and a real Prometheus
server scraping it with config/prometheus/scrape.yml reports the open listen streams and evaluates every rule
and every dashboard query.

Needs `prometheus` and `promtool` on PATH (Debian package `prometheus`, listed in .ci/apt-packages); the tests
skip, saying so, where they are missing (a failure under CI). The server runs as a child process of the test,
on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.kit import ListenStream, Sidecar, eventually, rpc, scrape, serve_sidecar
from tests.peers import Upstream
from tests.prereqs import require_binary
from tests.procs import ServerProcess, free_port, http_answers

REPO_ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_CONFIG = REPO_ROOT / "config" / "prometheus"
DASHBOARD = REPO_ROOT / "config" / "grafana" / "mcp-sidecar.json"
PRICE = "catalog://price"
START_TIMEOUT_S = 30.0
QUERY_TIMEOUT_S = 30.0
"""Bound on waiting for a scraped value: scrapes run every second, so a few seconds is normal."""
STOP_TIMEOUT_S = 10.0
STREAMS = 3


def _tool(name: str) -> str:
    return require_binary(name, package="prometheus", needed_by="the Prometheus tests (CI: .ci/apt-packages)")


def _promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [_tool("promtool"), *args], input=stdin, capture_output=True, timeout=60, check=False, cwd=REPO_ROOT
    )


# -- promtool ------------------------------------------------------------------------------------------------


async def test_promtool_accepts_a_scrape_of_a_running_sidecar(
    modern_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    _tool("promtool")
    async with serve_sidecar(modern_upstream.url) as sidecar:
        # Traffic first, so the labelled families have samples (histograms with buckets, counters with labels).
        status, _ = await rpc(http, sidecar.url, "resources/read", {"uri": PRICE})
        assert status == 200
        stream = ListenStream(http, sidecar.url, 1, [PRICE])
        try:
            await stream.open()
            async with http.get(f"{sidecar.admin_url}/metrics") as resp:
                body = await resp.read()
        finally:
            await stream.close()
    assert b"mcp_sidecar_request_duration_seconds_bucket{" in body
    done = await asyncio.to_thread(_promtool, "check", "metrics", stdin=body)
    assert done.returncode == 0, (done.stdout + done.stderr).decode()
    assert (done.stdout + done.stderr).strip() == b""  # not even a lint remark


def test_promtool_accepts_the_alert_rules_and_their_unit_tests() -> None:
    rules = _promtool("check", "rules", str(PROMETHEUS_CONFIG / "alerts.yml"))
    assert rules.returncode == 0, (rules.stdout + rules.stderr).decode()
    tested = _promtool("test", "rules", str(PROMETHEUS_CONFIG / "alerts_test.yml"))
    assert tested.returncode == 0, (tested.stdout + tested.stderr).decode()


def test_promtool_accepts_the_example_scrape_config() -> None:
    done = _promtool("check", "config", str(PROMETHEUS_CONFIG / "scrape.yml"))
    assert done.returncode == 0, (done.stdout + done.stderr).decode()


# -- a real Prometheus server ---------------------------------------------------------------------------------


class _Prometheus:
    def __init__(self, url: str, process: ServerProcess) -> None:
        self.url = url
        self.process = process

    def output(self) -> str:
        return self.process.log_tail()

    async def api(self, http: aiohttp.ClientSession, path: str, **params: str) -> Any:
        async with http.get(f"{self.url}/api/v1/{path}", params=params) as resp:
            body = await resp.json()
        assert body["status"] == "success", body
        return body["data"]

    async def wait_for(self, http: aiohttp.ClientSession, query: str, expected: str) -> list[dict[str, Any]]:
        """Query until the single result's value is `expected` (bounded); returns the result."""
        seen: Any = None

        async def answered() -> bool:
            nonlocal seen
            seen = (await self.api(http, "query", query=query))["result"]
            return len(seen) == 1 and seen[0]["value"][1] == expected

        try:
            await eventually(answered, QUERY_TIMEOUT_S, 0.2)
        except AssertionError:
            pytest.fail(f"{query} never became {expected} (last: {seen}):\n{self.output()}")
        return list(seen)


def _config(tmp_path: Path, sidecar: Sidecar) -> Path:
    """config/prometheus/scrape.yml with its job pointed at `sidecar`, scraping every second."""
    example = yaml.safe_load((PROMETHEUS_CONFIG / "scrape.yml").read_text(encoding="utf-8"))
    (job,) = [job for job in example["scrape_configs"] if job["job_name"] == "mcp-sidecar"]
    target = sidecar.admin_url.removeprefix("http://")
    job.update(scrape_interval="1s", scrape_timeout="1s", static_configs=[{"targets": [target]}])
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(PROMETHEUS_CONFIG / name) for name in example["rule_files"]],
        "scrape_configs": [job],
    }
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@contextlib.asynccontextmanager
async def _prometheus(tmp_path: Path, config: Path) -> AsyncIterator[_Prometheus]:
    binary = _tool("prometheus")
    port = free_port()
    argv = [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]  # fmt: skip
    server = _Prometheus(f"http://127.0.0.1:{port}", ServerProcess("prometheus", argv, tmp_path / "prometheus.log"))
    async with server.process.serving(
        http_answers(f"{server.url}/-/ready"), START_TIMEOUT_S, stop_within_s=STOP_TIMEOUT_S
    ):
        yield server


def _dashboard_queries() -> list[str]:
    """Every panel query of the Grafana dashboard, with its variables as Grafana would fill them."""

    def panels(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [p for item in items for p in [item, *panels(item.get("panels", []))]]

    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = [target["expr"] for panel in panels(dashboard["panels"]) for target in panel.get("targets", [])]
    return [
        q.replace("$job", "mcp-sidecar").replace("$instance", ".*").replace("$__rate_interval", "1m") for q in queries
    ]


async def test_prometheus_scrapes_the_open_stream_count_and_runs_the_rules(
    tmp_path: Path, modern_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    _tool("prometheus")
    async with serve_sidecar(modern_upstream.url) as sidecar:
        streams = [ListenStream(http, sidecar.url, i, [PRICE]) for i in range(STREAMS)]
        try:
            for stream in streams:
                await stream.open()
            assert (await scrape(http, sidecar.admin_url)).value("mcp_sidecar_listen_streams") == STREAMS
            async with _prometheus(tmp_path, _config(tmp_path, sidecar)) as prometheus:
                (result,) = await prometheus.wait_for(http, "mcp_sidecar_listen_streams", str(STREAMS))
                target = sidecar.admin_url.removeprefix("http://")
                assert result["metric"] == {
                    "__name__": "mcp_sidecar_listen_streams",
                    "job": "mcp-sidecar",
                    "instance": target,
                }
                await streams[0].close()
                await prometheus.wait_for(http, "mcp_sidecar_listen_streams", str(STREAMS - 1))
                await prometheus.wait_for(http, "mcp_sidecar_upstream_up", "1")

                # Every alert rule loads and evaluates without error against real series.
                async def rules_evaluated() -> list[dict[str, Any]]:
                    groups = (await prometheus.api(http, "rules"))["groups"]
                    return [rule for group in groups for rule in group["rules"]]

                async with asyncio.timeout(QUERY_TIMEOUT_S):
                    while True:
                        rules = await rules_evaluated()
                        assert all(rule["health"] != "err" for rule in rules), rules
                        if all(rule["health"] == "ok" for rule in rules):
                            break
                        await asyncio.sleep(0.2)  # polling Prometheus' rule evaluation, bounded
                assert len(rules) == 10
                assert {rule["state"] for rule in rules} == {"inactive"}, [r for r in rules if r["state"] != "inactive"]

                # Every dashboard query is valid PromQL for this Prometheus.
                for query in _dashboard_queries():
                    await prometheus.api(http, "query", query=query)
        finally:
            for stream in streams:
                await stream.close()
