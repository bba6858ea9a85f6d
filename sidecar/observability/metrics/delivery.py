"""Delivery: notifications written to clients, changes merged into one waiting, and how long a change took."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from sidecar.observability.metrics.labels import LATENCY_BUCKETS, NOTIFICATION_METHODS

__all__ = ["DeliveryMetrics"]


class DeliveryMetrics:
    """Notifications written by method, changes coalesced, and the latency from a change to its notification."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.notifications = Counter(
            "mcp_sidecar_notifications",
            "Notifications written to clients (listen streams and 2025-11-25 sessions), by method",
            ["method"],
            registry=r,
        )
        self.coalesced = Counter(
            "mcp_sidecar_signals_coalesced",
            "Changes merged into a notification still waiting to be written to the same stream",
            registry=r,
        )
        self.delivery_latency = Histogram(
            "mcp_sidecar_change_delivery_seconds",
            "From a change detected to its notification written to a stream",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        for method in NOTIFICATION_METHODS:
            self.notifications.labels(method)
