"""The compatibility suite's report: every notification latency it measured, printed after the run.

    python3 -m pytest -q -rs tests/compat          # -s also shows each latency as it is measured

The third-party peers come from `bash .ci/install-peers` (under `.tools/`); without them those cases skip,
and under `CI=true` such a skip fails the run.
"""

from __future__ import annotations

import pytest

from tests.compat.upstreams import LATENCIES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not LATENCIES:
        return
    terminalreporter.section("compat: notification latencies")
    for what, seconds in LATENCIES:
        terminalreporter.write_line(f"{seconds * 1000:8.0f} ms  {what}")
