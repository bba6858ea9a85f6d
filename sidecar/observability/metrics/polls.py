"""Polling: each read of the upstream for a watch, how long and how late it was, what it found, and the budget."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sidecar.observability.metrics.labels import INTERVAL_BUCKETS, LATENCY_BUCKETS, POLL_OUTCOMES, WATCH_KINDS

__all__ = ["PollMetrics"]


class PollMetrics:
    """Polls by kind and outcome, their duration, lag and interval, the changes they found, the read budget."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.polls = Counter(
            "mcp_sidecar_polls",
            "Polls that reached the upstream (a watch's read, on its timer or at once after a write), "
            "by kind and outcome (ok; error: the upstream failed; error_state: it answered the read with a "
            "JSON-RPC error, which is the resource's state)",
            ["kind", "outcome"],
            registry=r,
        )
        self.poll_duration = Histogram(
            "mcp_sidecar_poll_duration_seconds",
            "How long each poll took, by kind; also counts, at no time, a due poll skipped because no stream "
            "holds the watch any more",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.poll_lag = Histogram(
            "mcp_sidecar_poll_schedule_lag_seconds",
            "How late each due poll started (a busy process, or polls over polling.max_concurrency)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.poll_changes = Counter(
            "mcp_sidecar_poll_changes",
            "Polls that found a change, by kind (over mcp_sidecar_polls_total: the share of reads that found one)",
            ["kind"],
            registry=r,
        )
        self.poll_interval = Histogram(
            "mcp_sidecar_poll_interval_seconds",
            "The interval each watch was scheduled at after a poll (ttlMs, its rule, or what the read budget "
            "allocated it), jitter included",
            buckets=INTERVAL_BUCKETS,
            registry=r,
        )
        self.read_budget = Gauge(
            "mcp_sidecar_read_budget_per_second",
            "This replica's share of polling.max_reads_per_s (the fleet's budget over the live replicas); "
            "compare with rate(mcp_sidecar_polls_total)",
            registry=r,
        )
        self.changes = Counter(
            "mcp_sidecar_changes",
            "Changes detected (content that differs from the last look), by kind",
            ["kind"],
            registry=r,
        )
        for kind in WATCH_KINDS:
            self.changes.labels(kind)
            self.poll_changes.labels(kind)
            for outcome in POLL_OUTCOMES:
                self.polls.labels(kind, outcome)
