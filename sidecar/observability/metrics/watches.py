"""Watches, and what makes them look at the upstream at once: its notifications, hints, forwarded tool calls."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from sidecar.observability.metrics.labels import HINT_OUTCOMES, NOTIFICATION_METHODS, TOOL_CALL_DECISIONS, WATCH_KINDS

__all__ = ["WatchMetrics"]


class WatchMetrics:
    """How many watches, for how many contexts, how many the upstream's own notifications cover, and what made
    them look at once."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
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
        for kind in WATCH_KINDS:
            self.watches.labels(kind)
        for method in NOTIFICATION_METHODS:
            self.upstream_notifications.labels(method)
        for outcome in HINT_OUTCOMES:
            self.hints_received.labels(outcome)
        for decision, reason in TOOL_CALL_DECISIONS:
            self.tool_calls.labels(decision, reason)
