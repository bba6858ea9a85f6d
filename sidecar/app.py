"""Builds the aiohttp application and wires the parts, in dependency order; torn down in reverse."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Middleware

from sidecar.admin import build_admin
from sidecar.bus import MemoryBus, RedisBus
from sidecar.changes import Bus
from sidecar.config import SidecarConfig
from sidecar.config.shown import secrets_in
from sidecar.downstream import LegacySessions, McpEndpoint, ReadThrough, StreamHub, ignore_authorization, no_tracebacks
from sidecar.fair_share import FairShare
from sidecar.identity import IdentityRule
from sidecar.masking import remember_secrets
from sidecar.observability.health import add_probes
from sidecar.observability.logs import INSTANCE_ID
from sidecar.observability.metrics import Metrics
from sidecar.upstream import StdioUpstream, Upstream, UpstreamClient, announce_upstream
from sidecar.watch import WatchRegistry

__all__ = [
    "ADMIN",
    "CLUSTER",
    "CONFIG",
    "FAIR_SHARE",
    "HUB",
    "IDENTITIES",
    "LEGACY",
    "METRICS",
    "REGISTRY",
    "UPSTREAM",
    "build_app",
]

logger = logging.getLogger(__name__)

CONFIG = web.AppKey("config", SidecarConfig)
METRICS = web.AppKey("metrics", Metrics)
UPSTREAM: web.AppKey[Upstream] = web.AppKey("upstream")
REGISTRY = web.AppKey("registry", WatchRegistry)
HUB = web.AppKey("hub", StreamHub)
IDENTITIES = web.AppKey("identities", IdentityRule)
CLUSTER = web.AppKey("cluster", RedisBus)
LEGACY = web.AppKey("legacy", LegacySessions)
FAIR_SHARE = web.AppKey("fair_share", FairShare)
ADMIN = web.AppKey("admin", web.Application)
"""The admin listener's application (/metrics, /status): served by the caller on `config.admin`."""


def build_app(config: SidecarConfig) -> web.Application:
    """The whole sidecar as one aiohttp application (the CLI runs it; tests serve it on a free port), with its
    admin application under `ADMIN`, to be served on `config.admin`."""
    remember_secrets(secrets_in(config))  # from here on no log line shows one, whoever writes it
    middlewares: list[Middleware] = [no_tracebacks]
    upstream: Upstream
    if config.upstream.is_stdio:
        # A stdio server has one authorization context for everyone: nothing is forwarded, Authorization is
        # dropped (and the first one logged).
        middlewares.append(ignore_authorization(config.upstream.display_url))
        identities = IdentityRule((), ())
    else:
        identities = IdentityRule(config.upstream.forward_headers, config.upstream.non_identity_headers)
    app = web.Application(middlewares=middlewares, handler_args={"max_field_size": 16384})
    metrics = Metrics()
    metrics.stream_limit.set(config.streams.max_streams)
    if config.upstream.is_stdio:
        upstream = StdioUpstream(config.upstream, config.cache, metrics)
    else:
        upstream = UpstreamClient(config.upstream, config.cache, metrics, identities)
    app[IDENTITIES] = identities
    app[CONFIG] = config
    app[METRICS] = metrics
    app[UPSTREAM] = upstream
    app.cleanup_ctx.append(_upstream_context)
    bus: Bus
    cluster: RedisBus | None = None
    if config.bus.backend == "redis":
        metrics.redis_configured.set(1)
        # The upstream's reachability goes into this replica's heartbeats: a replica that cannot read while
        # another can gives that one its keys and its clients (invariant 23).
        cluster = RedisBus(
            config.bus.redis_url.get_secret_value(),
            instance=INSTANCE_ID,
            metrics=metrics,
            lease_ms=config.bus.lease_ms,
            fallback=config.bus.fallback == "local",
            buckets=config.bus.buckets,
            upstream=upstream,
        )
        app[CLUSTER] = cluster
        app.cleanup_ctx.append(_cluster_context)
        bus = cluster
    else:
        bus = MemoryBus()
    readthrough = ReadThrough(config.cache, metrics, routing=cluster)
    # Subscribed before the streams: a change drops stale cache entries before anyone is told to re-read.
    bus.subscribe(readthrough.on_change)
    fair_share = _fair_share_of(config, metrics)
    app[FAIR_SHARE] = fair_share
    registry = WatchRegistry(
        upstream,
        config.polling,
        bus,
        metrics,
        fair_share,
        coordinator=cluster,
        replicas=(lambda: cluster.live_replicas) if cluster is not None else lambda: 1,
        hint_settle_ms=config.hints.settle_ms,
        tool_rules=config.revalidate.tools,
    )
    registry.on_observation(readthrough.observed)  # the cache drops what a watch's look contradicts
    hub = StreamHub(registry, upstream, bus, config.streams, metrics)
    legacy = LegacySessions(
        upstream, registry, hub, config.streams, metrics, fair_share, queue_wait_s=config.upstream.timeout_s
    )
    app[REGISTRY] = registry
    app[HUB] = hub
    app[LEGACY] = legacy
    if cluster is not None:
        cluster.on_moved(lambda moved: _move_clients(hub, legacy, cluster.moved if moved else None))
    app.cleanup_ctx.append(_watch_context)
    app.on_shutdown.append(_end_streams)

    endpoint = McpEndpoint(
        config,
        upstream,
        identities=identities,
        listen=hub.handle_listen,
        observer=registry.hearing,
        readthrough=readthrough,
        metrics=metrics,
        legacy=legacy,
        fair_share=fair_share,
    )
    path = config.listen.path
    app.router.add_post(path, endpoint.handle_post)
    app.router.add_get(path, endpoint.handle_get, allow_head=False)
    app.router.add_delete(path, endpoint.handle_delete)
    app.router.add_get("/.well-known/oauth-protected-resource", endpoint.handle_protected_resource_metadata)
    app.router.add_get("/.well-known/oauth-protected-resource/{path:.*}", endpoint.handle_protected_resource_metadata)
    # Anyone who can reach the MCP port may ask: ready or not, and nothing about the upstream (its address may
    # hold what an operator did not mean to publish); the reasons are the admin listener's.
    degraded = (lambda: cluster.degraded) if cluster is not None else (lambda: None)
    moved = (lambda: cluster.moved) if cluster is not None else (lambda: None)
    add_probes(app.router, upstream, degraded, moved, detail=False)

    # Metrics and the status page list what the sidecar watches: on a listener of their own, off the MCP port.
    admin = build_admin(
        config,
        metrics,
        upstream,
        registry,
        hub,
        fair_share,
        hint=registry.hearing.source,
        degraded=degraded,
        moved=moved,
        middlewares=[no_tracebacks],
    )
    app[ADMIN] = admin
    return app


def _fair_share_of(config: SidecarConfig, metrics: Metrics) -> FairShare:
    """The upstream's capacity for client requests, shared between clients: the HTTP pool's connections, or for a
    stdio server the requests it may have in flight less those the polls may take (past it, it refuses)."""
    upstream = config.upstream
    if upstream.is_stdio:
        capacity = max(1, upstream.max_in_flight - config.polling.max_concurrency)
    else:
        capacity = upstream.max_connections
    # Three quarters by default: one client's slow requests always leave a quarter of the slots to the others.
    per_client = upstream.max_requests_per_client or max(1, capacity * 3 // 4)
    return FairShare(
        capacity=capacity, per_client=per_client, max_queued_per_client=upstream.max_queued_per_client, metrics=metrics
    )


def _move_clients(hub: StreamHub, legacy: LegacySessions, why: str | None) -> None:
    """This replica cannot read the upstream and another can (`why`): its listen streams end with a retryable
    reason and its 2025-11-25 sessions end, so their clients come back through the load balancer to a replica that
    reads; `why` None: it serves them again."""
    hub.move(why)
    if why is not None:
        legacy.end_all()


async def _upstream_context(app: web.Application) -> AsyncIterator[None]:
    upstream = app[UPSTREAM]
    config = app[CONFIG]
    await upstream.start()
    # Where the upstream stands is logged once it is known, without waiting for a client or /readyz to ask.
    announcing = asyncio.get_running_loop().create_task(announce_upstream(upstream, config.polling, config.cache))
    yield
    announcing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await announcing
    await upstream.aclose()


async def _cluster_context(app: web.Application) -> AsyncIterator[None]:
    cluster = app[CLUSTER]
    app[IDENTITIES].use_key(await cluster.start())
    yield
    await cluster.aclose()


async def _watch_context(app: web.Application) -> AsyncIterator[None]:
    app[LEGACY].start()
    yield
    await app[LEGACY].aclose()
    await app[HUB].aclose()
    await app[REGISTRY].aclose()


async def _end_streams(app: web.Application) -> None:
    # Runs before aiohttp waits for handlers: each listen handler then writes its complete frame and returns.
    await app[HUB].close_all("shutdown")
    await app[LEGACY].aclose()
    # Requests still waiting on the upstream near the end of the grace get an error answer instead of being cut
    # by the exit (aiohttp would wait out the grace, then cancel them and wait as long again).
    app[UPSTREAM].drain(app[CONFIG].listen.shutdown_grace_s)
