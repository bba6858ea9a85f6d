"""Requests, by JSON-RPC method: a client's to the sidecar, and the sidecar's to the upstream."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from sidecar.observability.metrics.labels import KNOWN_METHODS, LATENCY_BUCKETS

__all__ = ["RequestMetrics", "method_label"]


def method_label(method: str) -> str:
    """A JSON-RPC method name as a label: known names as they are, anything else `other`."""
    return method if method in KNOWN_METHODS else "other"


class RequestMetrics:
    """How many requests, and how long each took, on both sides of the sidecar."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.requests = Counter(
            "mcp_sidecar_requests", "Requests from clients, by method and outcome", ["method", "outcome"], registry=r
        )
        self.request_duration = Histogram(
            "mcp_sidecar_request_duration_seconds",
            "How long the sidecar took to answer a client's request, by method",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_requests = Counter(
            "mcp_sidecar_upstream_requests",
            "Requests the sidecar sent upstream, by method and outcome",
            ["method", "outcome"],
            registry=r,
        )
        self.upstream_duration = Histogram(
            "mcp_sidecar_upstream_request_duration_seconds",
            "How long the upstream took to answer, by method",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
