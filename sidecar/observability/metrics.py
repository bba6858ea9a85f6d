"""Prometheus metrics; the only module that imports prometheus_client. Labels come from small fixed sets."""

from __future__ import annotations

import bisect
import platform

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import CONTENT_TYPE_LATEST, choose_encoder

from sidecar import __version__
from sidecar.observability.metric_labels import (
    END_REASONS,
    HINT_OUTCOMES,
    INTERVAL_BUCKETS,
    KNOWN_METHODS,
    LATENCY_BUCKETS,
    LIMITS,
    NOTIFICATION_METHODS,
    POLL_OUTCOMES,
    QUEUES,
    RESTART_REASONS,
    STDERR_OUTCOMES,
    TOOL_CALL_DECISIONS,
    WATCH_KINDS,
)
from sidecar.protocol.constants import LEGACY_VERSION, MODERN_VERSION

__all__ = ["CONTENT_TYPE_LATEST", "HINT_OUTCOMES", "TOOL_CALL_DECISIONS", "Metrics", "ObservationBatch", "method_label"]

# No `_created` series beside every counter and histogram: Prometheus does not use them (it infers resets), and
# they double the series an operator scrapes and stores. Process-wide, as prometheus_client keeps the switch.
disable_created_metrics()  # type: ignore[no-untyped-call]


class ObservationBatch:
    """Observations for one Histogram, counted in plain Python and added to it by `commit`, in one go.

    A fan-out writes thousands of notifications in one pass, and `Histogram.observe` takes two locks per value
    (about 2 us, a tenth of a stream's share of the pass). The exposition after `commit` is the one the same
    `observe` calls would give: a value lands in the first bucket whose bound is at least it, as there.
    """

    def __init__(self, histogram: Histogram) -> None:
        self._histogram = histogram
        # prometheus_client's own fields (stable since 0.4); without them, observe one at a time as before.
        self._bounds: list[float] | None = getattr(histogram, "_upper_bounds", None)
        self._counts = [0] * len(self._bounds or ())
        self._sum = 0.0
        self._values: list[float] = []

    def observe(self, value: float) -> None:
        if self._bounds is None:
            self._values.append(value)
            return
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._sum += value

    def commit(self) -> None:
        histogram = self._histogram
        if self._bounds is None:
            values, self._values = self._values, []
            for value in values:
                histogram.observe(value)
            return
        counts, self._counts = self._counts, [0] * len(self._bounds)
        if not any(counts):
            return
        histogram._sum.inc(self._sum)
        self._sum = 0.0
        buckets = histogram._buckets
        for index, count in enumerate(counts):
            if count:
                buckets[index].inc(count)


def method_label(method: str) -> str:
    """A JSON-RPC method name as a label: known names as they are, anything else `other`."""
    return method if method in KNOWN_METHODS else "other"


class Metrics:
    """Every metric family of one sidecar, in its own registry (tests build several apps in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
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
        self.listen_streams = Gauge("mcp_sidecar_listen_streams", "Open listen streams", registry=r)
        self.stream_limit = Gauge(
            "mcp_sidecar_stream_limit", "Listen streams this process accepts at most (streams.max_streams)", registry=r
        )
        self.legacy_sessions = Gauge("mcp_sidecar_legacy_sessions", "Open 2025-11-25 client sessions", registry=r)
        self.subscriptions = Gauge(
            "mcp_sidecar_subscriptions", "Resource URIs watched for listen streams, one per stream and URI", registry=r
        )
        self.watches = Gauge(
            "mcp_sidecar_watches",
            "Watches (what the sidecar keeps looking at for its clients), by kind",
            ["kind"],
            registry=r,
        )
        self.watched_contexts = Gauge(
            "mcp_sidecar_watched_contexts",
            "Authorization contexts with at least one watch (all public watches count as one)",
            registry=r,
        )
        self.native_watches = Gauge(
            "mcp_sidecar_native_watches",
            "Watches the upstream's own notifications cover (still polled, as a backstop); the rest are polled only",
            registry=r,
        )
        self.native_streams = Gauge(
            "mcp_sidecar_native_streams",
            "Notification streams the sidecar holds open to the upstream (at most one per authorization context)",
            registry=r,
        )
        self.upstream_notifications = Counter(
            "mcp_sidecar_upstream_notifications",
            "Change notifications the upstream sent; each makes the watch it names poll at once",
            ["method"],
            registry=r,
        )
        self.hints_received = Counter(
            "mcp_sidecar_hints_received",
            "Change announcements from the source of truth received on the admin listener, by outcome",
            ["outcome"],
            registry=r,
        )
        self.watches_hinted = Counter(
            "mcp_sidecar_watches_hinted",
            "Watches of this process made to look at the upstream at once by the source's change announcements",
            registry=r,
        )
        self.tool_calls = Counter(
            "mcp_sidecar_tool_calls",
            "tools/call requests forwarded, by decision (revalidate: the watches look at once; read_only: none "
            "does) and reason (annotation: the tool's readOnlyHint in the upstream's tools list; rule: a "
            "revalidate.tools rule; unknown: a tool not seen in a tools list, taken as writing)",
            ["decision", "reason"],
            registry=r,
        )
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
        self.keepalives = Counter("mcp_sidecar_keepalives", "Keep-alive comments written to quiet streams", registry=r)
        self.streams_ended = Counter(
            "mcp_sidecar_streams_ended", "Listen streams ended, by reason", ["reason"], registry=r
        )
        self.cache_hits = Counter("mcp_sidecar_cache_hits", "Requests answered from the response cache", registry=r)
        self.cache_misses = Counter(
            "mcp_sidecar_cache_misses", "Cacheable requests not found in the response cache", registry=r
        )
        self.cache_evictions = Counter(
            "mcp_sidecar_cache_evictions",
            "Cache entries evicted to stay within cache.max_entries and cache.max_bytes",
            registry=r,
        )
        self.cache_bytes = Gauge("mcp_sidecar_cache_bytes", "Bytes held by the response cache", registry=r)
        self.singleflight_joins = Counter(
            "mcp_sidecar_singleflight_joins",
            "Requests that shared the answer of an identical request already in flight upstream",
            registry=r,
        )
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
        # Series of the known label values exist from the start, at 0: a ratio or `increase()` then sees the
        # first error, rejection or change instead of a series that appears already at 1.
        for kind in WATCH_KINDS:
            self.watches.labels(kind)
            self.changes.labels(kind)
            self.poll_changes.labels(kind)
            for outcome in POLL_OUTCOMES:
                self.polls.labels(kind, outcome)
        for method in NOTIFICATION_METHODS:
            self.notifications.labels(method)
            self.upstream_notifications.labels(method)
        for limit in LIMITS:
            self.limit_rejections.labels(limit)
        for outcome in HINT_OUTCOMES:
            self.hints_received.labels(outcome)
        for queue in QUEUES:
            self.queue_depth.labels(queue)
            self.queue_wait.labels(queue)
        for reason in END_REASONS:
            self.streams_ended.labels(reason)
        for decision, reason in TOOL_CALL_DECISIONS:
            self.tool_calls.labels(decision, reason)
        for reason in RESTART_REASONS:
            self.upstream_restarts.labels(reason)
        for outcome in STDERR_OUTCOMES:
            self.upstream_stderr_lines.labels(outcome)
        build = Gauge(
            "mcp_sidecar_build_info",
            "Versions of the sidecar, Python and aiohttp, in the labels; always 1",
            ["version", "python", "aiohttp"],
            registry=r,
        )
        build.labels(__version__, platform.python_version(), aiohttp.__version__).set(1)

    def upstream_speaks(self, revision: str) -> None:
        """The upstream's protocol revision is `revision`: its era series is 1, the other's 0."""
        for known in (LEGACY_VERSION, MODERN_VERSION):
            self.upstream_era.labels(known).set(1 if known == revision else 0)

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition and its content type: OpenMetrics (with the exemplars that carry trace ids) when
        `accept` (the scraper's Accept header) asks for it, Prometheus text otherwise."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
