"""The Redis bus: whether Redis answers, the watches this replica polls for all, and the messages it carries."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["BusMetrics"]


class BusMetrics:
    """Redis reachability, a cut-off replica, polling moved between replicas, and messages in and out."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.redis_up = Gauge(
            "mcp_sidecar_redis_up",
            "1 while Redis answers; always 0 with bus.backend: memory, which uses no Redis",
            registry=r,
        )
        self.redis_configured = Gauge(
            "mcp_sidecar_redis_configured",
            "1 with bus.backend: redis (then mcp_sidecar_redis_up 0 means Redis is unreachable), 0 with memory",
            registry=r,
        )
        self.upstream_cut = Gauge(
            "mcp_sidecar_upstream_cut",
            "1 while this replica cannot reach the upstream and another replica can: the watches it polled and its "
            "clients moved to the replicas that can (Redis bus)",
            registry=r,
        )
        self.leases_held = Gauge(
            "mcp_sidecar_leases_held", "Watches this replica polls on behalf of all replicas (Redis bus)", registry=r
        )
        self.lease_acquisitions = Counter(
            "mcp_sidecar_lease_acquisitions",
            "Watches whose polling moved to this replica from another (Redis bus)",
            registry=r,
        )
        self.lease_losses = Counter(
            "mcp_sidecar_lease_losses",
            "Watches whose polling moved from this replica to another (Redis bus)",
            registry=r,
        )
        self.bus_received = Counter(
            "mcp_sidecar_bus_messages_received",
            "Messages this replica read from Redis (changes, first reads, which replica watches what)",
            registry=r,
        )
        self.bus_messages = Counter(
            "mcp_sidecar_bus_messages",
            "Changes sent to (out) or received from (in) other replicas through Redis",
            ["direction"],
            registry=r,
        )
        self.bus_publish_failures = Counter(
            "mcp_sidecar_bus_publish_failures",
            "Changes that could not be sent to other replicas through Redis",
            registry=r,
        )
