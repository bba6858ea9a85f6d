"""The sections besides `upstream`: listeners, polling, cache, streams, bus, metrics, admin, logging."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from sidecar.config.base import Section
from sidecar.config.polling_rules import PollingRule
from sidecar.config.redis_url import check_redis_url
from sidecar.config.syntax import check_host, check_http_url, check_origin, check_url_path
from sidecar.config.tls import ListenerTLS

__all__ = [
    "AdminConfig",
    "BusConfig",
    "CacheConfig",
    "ListenConfig",
    "LoggingConfig",
    "MetricsConfig",
    "PollingConfig",
    "StreamsConfig",
    "TracingConfig",
]

DEFAULT_PORT = 8080
DEFAULT_ADMIN_PORT = 9464
DEFAULT_MAX_BODY_BYTES = 1_048_576
DEFAULT_SHUTDOWN_GRACE_S = 10.0
DEFAULT_HEADER_TIMEOUT_S = 15.0  # a slow client is cut long before nginx's 60 s client_header_timeout would
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_MAX_CLIENT_CONNECTIONS = 12_000  # room for streams.max_streams (10,000) plus ordinary requests
DEFAULT_INTERVAL_MS = 5_000
DEFAULT_MIN_INTERVAL_MS = 250
DEFAULT_MAX_INTERVAL_MS = 300_000
DEFAULT_JITTER = 0.1
DEFAULT_BACKOFF_INITIAL_MS = 1_000
DEFAULT_BACKOFF_MAX_MS = 60_000
DEFAULT_POLL_CONCURRENCY = 64
DEFAULT_LINGER_MS = 5_000
DEFAULT_MAX_NATIVE_STREAMS = 100
DEFAULT_MAX_HINTED_POLLS_PER_S = 200.0  # a write hinting 2,000 watches costs one extra round over ten seconds
DEFAULT_MAX_BASELINES_PER_S = 200.0
DEFAULT_BASELINE_WAIT_S = 10.0
DEFAULT_BACKLOG = 2_048  # a burst of 1,024 connects waits in the kernel instead of being dropped
DEFAULT_REVALIDATE_DEBOUNCE_MS = 10  # the writes after a first one are batched over it (the first goes at once)
DEFAULT_CACHE_ENTRIES = 10_000
DEFAULT_CACHE_BYTES = 64 * 1_048_576
DEFAULT_LEASE_MS = 5_000
DEFAULT_BUCKETS = 1024  # as sidecar.bus.layout.DEFAULT_BUCKETS
DEFAULT_SESSION_IDLE_S = 1_800.0
DEFAULT_MAX_SESSIONS = 10_000
DEFAULT_MAX_SESSIONS_PER_CLIENT = 1_000
DEFAULT_SESSION_UNUSED_S = 60.0
DEFAULT_KEEPALIVE_S = 15.0  # aiohttp-sse's default; well under common 60 s proxy idle timeouts
DEFAULT_MAX_STREAMS = 10_000
DEFAULT_WRITE_BUFFER_BYTES = 64 * 1024  # aiohttp's own write limit before it drains
DEFAULT_STALL_TIMEOUT_S = 120.0  # aiohttp-sse's send timeout
DEFAULT_MAX_URIS_PER_STREAM = 1_000
DEFAULT_MAX_URI_LENGTH = 2_048


class ListenConfig(Section):
    host: str = Field("127.0.0.1", description="Address to bind; loopback by default.")
    port: int = Field(DEFAULT_PORT, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    path: str = Field("/mcp", description="The MCP endpoint path.")
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1024, description="Larger request bodies get 413.")
    allowed_origins: list[str] = Field(
        default_factory=list, description="Origins allowed besides localhost ones (when bound to loopback)."
    )
    shutdown_grace_s: float = Field(
        DEFAULT_SHUTDOWN_GRACE_S, gt=0, description="How long shutdown waits for requests in flight."
    )
    header_timeout_s: float = Field(
        DEFAULT_HEADER_TIMEOUT_S, gt=0, description="A new or idle connection closes unless a whole request head comes."
    )
    body_timeout_s: float = Field(DEFAULT_BODY_TIMEOUT_S, gt=0, description="A request body must arrive within this.")
    max_connections: int = Field(
        DEFAULT_MAX_CLIENT_CONNECTIONS,
        ge=1,
        description="Client connections at once; one more is closed at accept. "
        "Lowered at start to what the open-files limit leaves when it cannot be raised to fit.",
    )
    backlog: int = Field(
        DEFAULT_BACKLOG,
        ge=1,
        description="Connections the kernel holds before they are accepted (capped by net.core.somaxconn).",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Addresses or networks (CIDR) of proxies in front of the sidecar: from their connections, an "
        "anonymous client is known by the first address not in this list in forwarded_header (its fair share). "
        "Empty: every client is its connection's peer address; forwarding headers are ignored.",
    )
    forwarded_header: Literal["x-forwarded-for", "forwarded"] = Field(
        "x-forwarded-for",
        description="The header the trusted proxies write (nginx, most load balancers: X-Forwarded-For; RFC 7239 "
        "Forwarded). Only that one is read: the other is whatever the client sent.",
    )

    tls: ListenerTLS = Field(default_factory=ListenerTLS, description="HTTPS on the MCP port (and mTLS).")

    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        "auto",
        description="The event loop the process runs on: auto is uvloop on Linux when it is installed (asyncio's "
        "own loop otherwise), uvloop requires it, asyncio never uses it.",
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or network (CIDR)") from None
        return value

    @field_validator("path")
    @classmethod
    def _path_is_absolute(cls, value: str) -> str:
        check_url_path(value)
        return value

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        check_host(value)
        return value

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        for origin in value:
            check_origin(origin)
        return value


class PollingConfig(Section):
    default_interval_ms: int = Field(DEFAULT_INTERVAL_MS, ge=1, description="Used when ttlMs is absent or 0.")
    min_interval_ms: int = Field(DEFAULT_MIN_INTERVAL_MS, ge=1, description="Floor for ttlMs and for hints.")
    max_interval_ms: int = Field(DEFAULT_MAX_INTERVAL_MS, ge=1, description="Ceiling for ttlMs.")
    jitter: float = Field(DEFAULT_JITTER, ge=0, lt=1, description="Each interval is scaled by 1 +/- jitter.")
    backoff_initial_ms: int = Field(DEFAULT_BACKOFF_INITIAL_MS, ge=1)
    backoff_max_ms: int = Field(DEFAULT_BACKOFF_MAX_MS, ge=1)
    max_concurrency: int = Field(DEFAULT_POLL_CONCURRENCY, ge=1, description="Polls in flight at once.")
    linger_ms: int = Field(DEFAULT_LINGER_MS, ge=0, description="A watch outlives its last stream this long.")
    revalidate_debounce_ms: int = Field(
        DEFAULT_REVALIDATE_DEBOUNCE_MS,
        ge=0,
        description="A write through the sidecar hints watches at once; the writes within this window after it are "
        "one more round at its end (a burst costs a watch at most two reads).",
    )
    native_notifications: bool = Field(
        True,
        description="Subscribe upstream when it can push (resources.subscribe, listChanged, listen) and poll at "
        "once on its notifications; covered keys are polled only every max_interval_ms. false: poll only.",
    )
    max_hinted_polls_per_s: float = Field(
        DEFAULT_MAX_HINTED_POLLS_PER_S,
        gt=0,
        description="Extra polls that hints (writes, the upstream's notifications, recovery) may cause a second, "
        "across all watches; more are deferred, never dropped.",
    )
    native_backstop_ms: int = Field(
        0,
        ge=0,
        description="Poll interval of keys the upstream's own notifications cover. 0: their usual interval (the "
        "notifications only make changes arrive sooner); set it (e.g. max_interval_ms) only for an upstream known to "
        "announce every change: the reference server declares resources.subscribe and announces nothing until asked.",
    )
    max_native_streams: int = Field(
        DEFAULT_MAX_NATIVE_STREAMS, ge=0, description="Upstream notification streams at most (one per context)."
    )
    max_baselines_per_s: float = Field(
        DEFAULT_MAX_BASELINES_PER_S,
        gt=0,
        description="First reads of new subscriptions one client may start a second beside the polls; more wait "
        "their turn among the client's requests upstream (a resource found missing is not read again for "
        "default_interval_ms).",
    )
    baseline_wait_s: float = Field(
        DEFAULT_BASELINE_WAIT_S,
        gt=0,
        description="How long an ack waits for a first read over max_baselines_per_s to start; a URI whose read "
        "could not start by then is left out of the ack.",
    )
    rules: list[PollingRule] = Field(
        default_factory=list,
        description="Per-URI rules, the first whose match fits a URI wins: {match: GLOB, interval_ms: N, ignore: "
        "{json_pointers: [...], patterns: [...]}} (see Rules).",
    )
    max_reads_per_s: float = Field(
        0,
        ge=0,
        description="Polls of the upstream a second at most, every key, context and hinted poll together; on "
        "replicas the fleet's, each taking its share by the live replicas. 0: no budget.",
    )
    allocation: Literal["adaptive", "uniform"] = Field(
        "adaptive",
        description="How a budget the wanted schedule exceeds is spent: adaptive gives polls where changes are "
        "found (weighted by streams holding the key), uniform stretches every interval alike. Every key is still "
        "polled every max_interval_ms.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> PollingConfig:
        if self.min_interval_ms > self.max_interval_ms:
            raise ValueError(
                f"min_interval_ms ({self.min_interval_ms}) must not exceed max_interval_ms ({self.max_interval_ms})"
            )
        if 0 < self.native_backstop_ms < self.min_interval_ms:
            raise ValueError(f"native_backstop_ms must be 0 or at least min_interval_ms ({self.min_interval_ms})")
        if self.backoff_initial_ms > self.backoff_max_ms:
            raise ValueError(
                f"backoff_initial_ms ({self.backoff_initial_ms}) must not exceed backoff_max_ms ({self.backoff_max_ms})"
            )
        return self


class CacheConfig(Section):
    default_scope: Literal["public", "private"] = Field(
        "private", description="cacheScope stamped on legacy results; private is the only safe default."
    )
    default_ttl_ms: int = Field(0, ge=0, description="ttlMs stamped on legacy results; 0 means always stale.")
    max_entries: int = Field(DEFAULT_CACHE_ENTRIES, ge=0, description="Cached results at most; 0 turns caching off.")
    max_bytes: int = Field(DEFAULT_CACHE_BYTES, ge=0, description="Bytes of cached results at most.")
    public_requires_verified_context: bool = Field(
        True,
        description="Serve a cached public result to a context only after the upstream answered that context "
        "for that request once (the spec allows sharing public results with anyone; a careful proxy does not "
        "hand them to clients the upstream would refuse). false: any client gets them.",
    )


class StreamsConfig(Section):
    renamed = {"max_sessions_per_context": "max_sessions_per_client"}

    keepalive_s: float = Field(DEFAULT_KEEPALIVE_S, gt=0, description="Comment line on quiet listen streams.")
    max_streams: int = Field(DEFAULT_MAX_STREAMS, ge=1, description="Listen streams per process.")
    write_buffer_bytes: int = Field(
        DEFAULT_WRITE_BUFFER_BYTES,
        ge=1024,
        description="Unsent bytes a listen stream may buffer; past it, signals wait as pending (merging) instead.",
    )
    stall_timeout_s: float = Field(
        DEFAULT_STALL_TIMEOUT_S,
        gt=0,
        description="A listen client that reads nothing this long with its buffer full is disconnected.",
    )
    max_uris_per_stream: int = Field(DEFAULT_MAX_URIS_PER_STREAM, ge=1, description="Extra URIs leave the ack.")
    max_age_s: float = Field(
        0,
        ge=0,
        description="A listen stream older than this (less up to 10% jitter, so they do not all end at once) ends "
        "with the complete result; its client listens again and re-reads, perhaps on another replica (after a "
        "scale-out, clients spread onto the new ones). 0: streams live as long as their clients.",
    )
    max_uri_length: int = Field(DEFAULT_MAX_URI_LENGTH, ge=16, description="Longer URIs are -32602.")
    max_sessions: int = Field(
        DEFAULT_MAX_SESSIONS, ge=1, description="2025-11-25 client sessions per process; more get 503."
    )
    session_idle_s: float = Field(
        DEFAULT_SESSION_IDLE_S, gt=0, description="A 2025-11-25 session idle this long (no GET stream) ends."
    )
    max_sessions_per_client: int = Field(
        DEFAULT_MAX_SESSIONS_PER_CLIENT,
        ge=1,
        description="2025-11-25 sessions one client (its authorization context, or for anonymous clients its "
        "address) may hold; more get 429.",
    )
    session_unused_s: float = Field(
        DEFAULT_SESSION_UNUSED_S,
        gt=0,
        description="A 2025-11-25 session that sent no request and opened no stream after initialize ends this soon.",
    )


class BusConfig(Section):
    backend: Literal["memory", "redis"] = Field("memory", description="redis for several replicas.")
    redis_url: SecretStr = Field(
        SecretStr("redis://127.0.0.1:6379/0"),
        description="Used when backend is redis: redis://, rediss:// or unix:// for one Redis (or Valkey); "
        "redis+cluster://host:port,host:port (seed nodes; rediss+cluster:// with TLS) for a Redis Cluster, with "
        "sharded pub/sub. Another scheme is an error.",
    )
    fallback: Literal["none", "local"] = Field(
        "none", description="Redis unreachable at start: none fails, local starts polling on its own."
    )
    lease_ms: int = Field(
        DEFAULT_LEASE_MS,
        ge=300,
        description="Heartbeat life: a replica silent this long is taken for dead and its keys move to others; "
        "each replica beats every third of it.",
    )
    buckets: int = Field(
        DEFAULT_BUCKETS,
        ge=1,
        le=65_536,
        description="Event channels the fleet's keys hash into; a replica listens only to those of its keys. "
        "Every replica of a fleet must use the same number.",
    )

    @field_validator("redis_url")
    @classmethod
    def _known_scheme(cls, value: SecretStr) -> SecretStr:
        check_redis_url(value.get_secret_value())
        return value


class MetricsConfig(Section):
    path: str = Field("/metrics", description="Prometheus scrape path (on the admin listener).")

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        check_url_path(value)
        return value


class AdminConfig(Section):
    host: str = Field(
        "127.0.0.1", description="Address of the admin listener (/metrics, /status, /healthz, /readyz); loopback."
    )
    port: int = Field(DEFAULT_ADMIN_PORT, ge=0, le=65535, description="Its TCP port; 0 picks a free one.")
    tls: ListenerTLS = Field(default_factory=ListenerTLS, description="HTTPS on the admin port, set apart.")

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        check_host(value)
        return value


class TracingConfig(Section):
    enabled: bool = Field(
        False,
        description="Export OpenTelemetry traces over OTLP/HTTP (needs the otel extra). Also on with the standard "
        "OTEL_TRACES_EXPORTER=otlp, the OTEL_EXPORTER_OTLP_* variables then saying where.",
    )
    endpoint: str | None = Field(
        None, description="The OTLP/HTTP traces URL (http://collector:4318/v1/traces); absent: OTEL_EXPORTER_OTLP_*."
    )
    service_name: str = Field("mcp-sidecar", description="service.name of the spans (OTEL_SERVICE_NAME wins).")
    sample_ratio: float = Field(
        1.0, ge=0, le=1, description="Share of new traces recorded; a client's sampled trace is always continued."
    )

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None:
            check_http_url(value)
        return value


class LoggingConfig(Section):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="The least severe level logged.")
    format: Literal["auto", "json", "text"] = Field(
        "auto",
        description="auto: one readable text line per record when stderr is a terminal, JSON lines otherwise "
        "(a collector, a pipe, a container); or json, or text, whatever stderr is.",
    )
