"""The official MCP conformance suite against the sidecar, in front of an SDK fixture upstream.

`@modelcontextprotocol/conformance` (pinned in `.ci/install-conformance`) runs as a client against the
sidecar for the frozen `--requirements` of 2026-07-28 (the sidecar's own envelope validation,
`server/discover`, listen streams synthesised by polling, revalidate-on-write, MRTR pass-through,
streamed progress, DNS-rebinding guard) and of 2025-11-25 (sidecar-minted sessions relayed onto the
upstream's, `resources/subscribe` on the watch engine, sampling, elicitation and logs on the POST stream).

The upstream is `tests/peers/conformance_server.py`: an SDK 2.3 `MCPServer(subscriptions=False)` with the
fixture names the scenarios call. Failures the fixture causes may be listed, with their reasons, in
`conformance-baseline.yml`; the suite then treats a WARNING in a scored scenario as a failure too.

Needs Node >= 22 and the suite under `.tools/` (`bash .ci/install-conformance`); skipped without them (a
failure under CI).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from tests.kit import serve_sidecar
from tests.peers import Upstream, start_conformance_upstream
from tests.prereqs import needs

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS = REPO_ROOT / ".tools"
NODE = TOOLS / "node22" / "node_modules" / ".bin" / "node"
PACKAGE = TOOLS / "conformance" / "node_modules" / "@modelcontextprotocol" / "conformance"
SUITE = PACKAGE / "dist" / "index.js"
BASELINE = Path(__file__).with_name("conformance-baseline.yml")
RUN_TIMEOUT_S = 240.0
"""One whole requirement set; about 5 s on a developer machine."""

# Fast polling: the suite reads a listen stream for only 0.8-1.5 s after its trigger tool call, so the
# list re-read that revalidate-on-write schedules must come within a few tens of milliseconds.
POLLING = {"min_interval_ms": 20, "default_interval_ms": 1000, "revalidate_debounce_ms": 20, "linger_ms": 1000}
LIST_TTL_MS = 60_000
"""The fixture's lists say they stay fresh for a minute, so the sidecar's periodic list polls cannot be what
delivers list_changed in time: only revalidate-on-write after the trigger's `tools/call` can."""

pytestmark = [
    needs(
        None
        if NODE.exists() and SUITE.exists()
        else "conformance suite not installed under .tools/ (run: bash .ci/install-conformance)"
    ),
    pytest.mark.timeout(RUN_TIMEOUT_S + 60),
]


@pytest.fixture
async def fixture_upstream() -> AsyncIterator[Upstream]:
    async with await start_conformance_upstream(read_ttl_ms=1000, list_ttl_ms=LIST_TTL_MS) as up:
        yield up


def _scored(revision: str) -> set[str]:
    """The server scenarios the revision's frozen requirement set scores (the package's own list)."""
    requirements = yaml.safe_load((PACKAGE / "requirements" / f"{revision}.yaml").read_text())
    return set(requirements.get("server") or [])


def _failures(results: Path, scored: set[str]) -> list[str]:
    """Every check of a scored scenario that is neither SUCCESS nor INFO, one line each, for the report."""
    lines = []
    for path in sorted(results.glob("*/checks.json")):
        scenario = re.sub(r"^server-|-\d{4}-\d{2}-\d{2}T[\d-]+Z$", "", path.parent.name)
        if scenario not in scored:
            continue
        for check in json.loads(path.read_text()):
            if check.get("status") not in ("SUCCESS", "INFO"):
                details = json.dumps(check.get("details"))[:500]
                lines.append(
                    f"{scenario}: {check.get('id')} {check.get('status')} {check.get('errorMessage')} {details}"
                )
    return lines


async def _run_suite(url: str, revision: str, results: Path) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        str(NODE), str(SUITE), "server", "--url", url, "--requirements", revision,
        "--expected-failures", str(BASELINE), "-o", str(results),
        cwd=REPO_ROOT, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1"},
        start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT_S)
    except TimeoutError:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the suite and anything it started
        await proc.wait()
        pytest.fail(f"conformance run for {revision} did not finish in {RUN_TIMEOUT_S} s")
    assert proc.returncode is not None
    return proc.returncode, output.decode(errors="replace")


@pytest.mark.parametrize("revision", ["2026-07-28", "2025-11-25"])
async def test_official_conformance_suite_passes_through_the_sidecar(
    revision: str, fixture_upstream: Upstream, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="sidecar")
    results = tmp_path / "results"
    async with serve_sidecar(fixture_upstream.url, polling=POLLING) as sidecar:
        started = time.monotonic()
        code, output = await _run_suite(sidecar.url, revision, results)
        elapsed = time.monotonic() - started
    output = re.sub(r"\x1b\[[0-9;]*m", "", output)  # the suite colours its summary whatever NO_COLOR says
    summary = output[output.find("=== SUMMARY") :] if "=== SUMMARY" in output else output[-8000:]
    report = "\n".join([summary, "-- scored checks not SUCCESS/INFO:", *_failures(results, _scored(revision))])
    assert code == 0, f"conformance {revision} exited {code} after {elapsed:.1f} s:\n{report}"
    assert "Baseline check passed" in output, report
    # A client hanging up mid-stream is routine for the suite; the sidecar must not log it as a failure.
    errors = [r.getMessage() for r in caplog.records if r.name.startswith("sidecar") and r.levelno >= logging.ERROR]
    assert not errors, errors
