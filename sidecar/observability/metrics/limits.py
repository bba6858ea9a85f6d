"""Configured limits: work they refused, work waiting its turn under them, and the clients sharing them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sidecar.observability.metrics.labels import LATENCY_BUCKETS, LIMITS, QUEUES

__all__ = ["LimitMetrics"]


class LimitMetrics:
    """Rejections by limit, queue depth and wait by queue, and the clients with work upstream."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.limit_rejections = Counter(
            "mcp_sidecar_limit_rejections", "Work refused by a configured limit, by limit", ["limit"], registry=r
        )
        self.queue_depth = Gauge(
            "mcp_sidecar_queue_depth", "Work waiting its turn under a limit now, by limit", ["limit"], registry=r
        )
        self.queue_wait = Histogram(
            "mcp_sidecar_queue_wait_seconds",
            "How long work waited its turn under a limit: client requests for a slot upstream (0: one was free), "
            "polls for polling.max_concurrency, polls asked for by writes deferred by polling.max_hinted_polls_per_s, "
            "polls waiting their slot of polling.max_reads_per_s",
            ["limit"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.clients_active = Gauge(
            "mcp_sidecar_clients_active",
            "Clients (the unit of fair share: an address, or a credential the upstream accepted) with a request "
            "upstream in flight or waiting",
            registry=r,
        )
        for limit in LIMITS:
            self.limit_rejections.labels(limit)
        for queue in QUEUES:
            self.queue_depth.labels(queue)
            self.queue_wait.labels(queue)
