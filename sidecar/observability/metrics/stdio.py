"""A stdio upstream's child process: its restarts, its stderr lines, and stdout lines that were not JSON-RPC."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from sidecar.observability.metrics.labels import RESTART_REASONS, STDERR_OUTCOMES

__all__ = ["StdioMetrics"]


class StdioMetrics:
    """Restarts by what ended the previous process, stderr lines logged or dropped, bad stdout lines."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.upstream_restarts = Counter(
            "mcp_sidecar_upstream_restarts",
            "Restarts of a stdio upstream, by what ended the previous process",
            ["reason"],
            registry=r,
        )
        self.upstream_stderr_lines = Counter(
            "mcp_sidecar_upstream_stderr_lines",
            "stderr lines of a stdio upstream, logged or dropped over upstream.stderr_lines_per_s",
            ["outcome"],
            registry=r,
        )
        self.upstream_bad_lines = Counter(
            "mcp_sidecar_upstream_bad_lines",
            "Lines a stdio upstream wrote to stdout that were not JSON-RPC",
            registry=r,
        )
        for reason in RESTART_REASONS:
            self.upstream_restarts.labels(reason)
        for outcome in STDERR_OUTCOMES:
            self.upstream_stderr_lines.labels(outcome)
