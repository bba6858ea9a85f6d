"""Prometheus metrics; the only module that imports prometheus_client. Labels come from small fixed sets."""

from __future__ import annotations

import platform

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from sidecar import __version__

__all__ = ["CONTENT_TYPE_LATEST", "Metrics", "method_label"]

_KNOWN_METHODS = frozenset(
    {
        "server/discover",
        "subscriptions/listen",
        "tools/list",
        "tools/call",
        "prompts/list",
        "prompts/get",
        "resources/list",
        "resources/read",
        "resources/templates/list",
        "completion/complete",
        "initialize",
        "ping",
        "probe",
        "legacy-session",
    }
)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def method_label(method: str) -> str:
    """A JSON-RPC method name as a label: known names as they are, anything else `other`."""
    return method if method in _KNOWN_METHODS else "other"


class Metrics:
    """Every metric family of one sidecar, in its own registry (tests build several apps in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "mcp_sidecar_requests", "Downstream requests by method and outcome", ["method", "outcome"], registry=r
        )
        self.request_duration = Histogram(
            "mcp_sidecar_request_duration_seconds",
            "Downstream request duration",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_requests = Counter(
            "mcp_sidecar_upstream_requests",
            "Requests sent upstream by method and outcome",
            ["method", "outcome"],
            registry=r,
        )
        self.upstream_duration = Histogram(
            "mcp_sidecar_upstream_request_duration_seconds",
            "Upstream request duration",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_up = Gauge("mcp_sidecar_upstream_up", "1 while the upstream answers", registry=r)
        self.upstream_era = Gauge("mcp_sidecar_upstream_era_info", "The era the upstream speaks", ["era"], registry=r)
        self.listen_streams = Gauge("mcp_sidecar_listen_streams", "Open listen streams", registry=r)
        self.subscriptions = Gauge("mcp_sidecar_subscriptions", "Stream x URI subscriptions", registry=r)
        self.watches = Gauge("mcp_sidecar_watches", "Active watches by kind", ["kind"], registry=r)
        self.partitions = Gauge("mcp_sidecar_partitions", "Authorization contexts with a watch", registry=r)
        self.polls = Counter("mcp_sidecar_polls", "Polls by kind and outcome", ["kind", "outcome"], registry=r)
        self.poll_duration = Histogram(
            "mcp_sidecar_poll_duration_seconds", "Poll duration", ["kind"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.poll_lag = Histogram(
            "mcp_sidecar_poll_schedule_lag_seconds",
            "How late a poll started against its due time",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.changes = Counter("mcp_sidecar_changes", "Changes detected by kind", ["kind"], registry=r)
        self.notifications = Counter(
            "mcp_sidecar_notifications", "Notifications written to listen streams", ["method"], registry=r
        )
        self.coalesced = Counter(
            "mcp_sidecar_signals_coalesced", "Signals merged into one already pending on a stream", registry=r
        )
        self.delivery_latency = Histogram(
            "mcp_sidecar_change_delivery_seconds",
            "Change detection to notification written",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.limit_rejections = Counter(
            "mcp_sidecar_limit_rejections", "Work refused by a configured limit", ["limit"], registry=r
        )
        self.keepalives = Counter("mcp_sidecar_keepalives", "Keep-alive comments sent", registry=r)
        self.streams_ended = Counter(
            "mcp_sidecar_streams_ended", "Listen streams ended, by reason", ["reason"], registry=r
        )
        self.cache_hits = Counter("mcp_sidecar_cache_hits", "Requests answered from the response cache", registry=r)
        self.cache_misses = Counter("mcp_sidecar_cache_misses", "Cacheable requests not in the cache", registry=r)
        self.cache_evictions = Counter(
            "mcp_sidecar_cache_evictions", "Entries evicted to stay within cache bounds", registry=r
        )
        self.cache_bytes = Gauge("mcp_sidecar_cache_bytes", "Bytes held by the response cache", registry=r)
        self.singleflight_joins = Counter(
            "mcp_sidecar_singleflight_joins", "Requests that joined an identical one in flight", registry=r
        )
        build = Gauge("mcp_sidecar_build_info", "Build information", ["version", "python", "aiohttp"], registry=r)
        build.labels(__version__, platform.python_version(), aiohttp.__version__).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)
