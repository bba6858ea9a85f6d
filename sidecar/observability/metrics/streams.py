"""Clients' listen streams and 2025-11-25 sessions: how many are open, what they watch, how they are kept and end."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from sidecar.observability.metrics.labels import END_REASONS

__all__ = ["StreamMetrics", "StreamUpkeepMetrics"]


class StreamMetrics:
    """Open streams and sessions, the stream limit, and the URIs they watch."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.listen_streams = Gauge("mcp_sidecar_listen_streams", "Open listen streams", registry=r)
        self.stream_limit = Gauge(
            "mcp_sidecar_stream_limit", "Listen streams this process accepts at most (streams.max_streams)", registry=r
        )
        self.legacy_sessions = Gauge("mcp_sidecar_legacy_sessions", "Open 2025-11-25 client sessions", registry=r)
        self.subscriptions = Gauge(
            "mcp_sidecar_subscriptions", "Resource URIs watched for listen streams, one per stream and URI", registry=r
        )


class StreamUpkeepMetrics:
    """Keep-alives written to quiet streams, and streams ended by reason (apart from `StreamMetrics` only to keep
    their place in `/metrics`, after the limits)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.keepalives = Counter("mcp_sidecar_keepalives", "Keep-alive comments written to quiet streams", registry=r)
        self.streams_ended = Counter(
            "mcp_sidecar_streams_ended", "Listen streams ended, by reason", ["reason"], registry=r
        )
        for reason in END_REASONS:
            self.streams_ended.labels(reason)
