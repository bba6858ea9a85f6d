"""The upstream's state: reachable, usable, and the protocol revision it speaks."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from sidecar.protocol import LEGACY_VERSION, MODERN_VERSION

__all__ = ["UpstreamMetrics"]


class UpstreamMetrics:
    """Whether the upstream answers, whether its answers are MCP, and which revision it speaks."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.upstream_up = Gauge(
            "mcp_sidecar_upstream_up", "1 while the upstream answers, 0 while it cannot be reached", registry=r
        )
        self.upstream_usable = Gauge(
            "mcp_sidecar_upstream_usable",
            "1 while the upstream's answers are MCP; 0 while it answers something else (a wrong path, say)",
            registry=r,
        )
        self.upstream_usable.set(1)  # 0 only once an answer was found unusable (a stdio server never is)
        self.upstream_era = Gauge(
            "mcp_sidecar_upstream_era_info",
            "The protocol revision the upstream speaks: 1 on the series of its revision",
            ["era"],
            registry=r,
        )

    def upstream_speaks(self, revision: str) -> None:
        """The upstream's protocol revision is `revision`: its era series is 1, the other's 0."""
        for known in (LEGACY_VERSION, MODERN_VERSION):
            self.upstream_era.labels(known).set(1 if known == revision else 0)
