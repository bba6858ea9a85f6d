"""The admin listener's application: /metrics, /status, the probes with their reasons, and `POST /hints` when a
hint token is configured. Off the MCP port: what it shows (the upstream's address, what is watched) is the
operator's, not every client's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web
from aiohttp.typedefs import Middleware

from sidecar.config import SidecarConfig
from sidecar.hints import HintEndpoint, HintToken
from sidecar.observability.health import Readiness, add_probes
from sidecar.observability.metrics import Metrics
from sidecar.observability.status import FairShareView, StreamsView, UpstreamView, WatchesView, make_status
from sidecar.watch.source_hints import SourceHint

__all__ = ["HINT_TOKEN", "build_admin"]

HINT_TOKEN = web.AppKey("hint_token", HintToken)
"""The bearer token of `POST /hints` (only with `hints.token_file`): read again on SIGHUP."""


class _Upstream(UpstreamView, Readiness, Protocol):
    """What the admin listener asks of the upstream: what the status page and the probes show."""


def build_admin(
    config: SidecarConfig,
    metrics: Metrics,
    upstream: _Upstream,
    watches: WatchesView,
    streams: StreamsView,
    fair_share: FairShareView,
    *,
    hint: Callable[[SourceHint], int],
    degraded: Callable[[], str | None],
    moved: Callable[[], str | None],
    middlewares: list[Middleware],
) -> web.Application:
    admin = web.Application(middlewares=middlewares)
    add_probes(admin.router, upstream, degraded, moved, detail=True)
    admin.router.add_get(config.metrics.path, _metrics_handler(metrics, upstream))
    admin.router.add_get("/status", make_status(upstream, watches, streams, fair_share))
    if config.hints.token_file is not None:
        # Only here, and only with a token: the source of truth's way to say what changed (never on the MCP port).
        token = admin[HINT_TOKEN] = HintToken(config.hints.token_file)
        hints = HintEndpoint(token, hint, metrics, warm_ms=config.hints.settle_ms)
        admin.router.add_route("*", "/hints", hints.serve)
    return admin


def _metrics_handler(metrics: Metrics, upstream: UpstreamView) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def serve_metrics(request: web.Request) -> web.Response:
        metrics.upstream_up.set(1 if upstream.up else 0)
        body, content_type = metrics.render(request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})

    return serve_metrics
