"""The sidecar in the test's own process: the app served on free loopback ports as `mcp-sidecar run` serves it,
and the questions a test asks of it directly (its context for a credential, how often work waited its turn)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sidecar.app import ADMIN, IDENTITIES, METRICS, build_app
from sidecar.config import SidecarConfig
from sidecar.serving import GuardedRunner, install_quiet_errors
from sidecar.tls import server_context

__all__ = ["Sidecar", "context_of", "make_config", "serve_config", "serve_sidecar", "waits"]


@dataclass
class Sidecar:
    url: str
    base_url: str
    app: web.Application
    runner: web.AppRunner
    admin_url: str
    """The admin listener (/metrics, /status), on a port of its own."""


def make_config(upstream_url: str, **sections: dict[str, Any]) -> SidecarConfig:
    data: dict[str, Any] = {"upstream": {"url": upstream_url}, "listen": {"port": 0}, "logging": {"format": "text"}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return SidecarConfig.model_validate(data)


@contextlib.asynccontextmanager
async def serve_sidecar(upstream_url: str, **sections: dict[str, Any]) -> AsyncIterator[Sidecar]:
    """The sidecar app on 127.0.0.1 in front of `upstream_url`, with the same runner settings as `mcp-sidecar run`."""
    async with serve_config(make_config(upstream_url, **sections)) as sidecar:
        yield sidecar


@contextlib.asynccontextmanager
async def serve_config(config: SidecarConfig) -> AsyncIterator[Sidecar]:
    """The sidecar app for `config` on 127.0.0.1 (free ports), its admin listener beside it, served as
    `mcp-sidecar run` serves them."""
    install_quiet_errors(asyncio.get_running_loop())
    app = build_app(config)
    metrics = app[METRICS]
    runner = GuardedRunner(app, config.listen, metrics, handler_cancellation=True, shutdown_timeout=2, access_log=None)
    admin = GuardedRunner(app[ADMIN], config.listen, metrics, access_log=None)
    await runner.setup()
    try:
        await admin.setup()
        listen_tls, admin_tls = server_context(config.listen.tls), server_context(config.admin.tls)
        await web.TCPSite(runner, "127.0.0.1", 0, backlog=config.listen.backlog, ssl_context=listen_tls).start()
        await web.TCPSite(admin, "127.0.0.1", 0, ssl_context=admin_tls).start()
        host, port = runner.addresses[0][:2]
        base = f"{'https' if listen_tls else 'http'}://{host}:{port}"
        admin_host, admin_port = admin.addresses[0][:2]
        admin_url = f"{'https' if admin_tls else 'http'}://{admin_host}:{admin_port}"
        yield Sidecar(f"{base}{config.listen.path}", base, app, runner, admin_url)
    finally:
        await runner.cleanup()
        await admin.cleanup()


def waits(sidecar: Sidecar, limit: str) -> int:
    """How many times work waited its turn under `limit` (`mcp_sidecar_queue_wait_seconds{limit}`'s count)."""
    child = sidecar.app[METRICS].queue_wait.labels(limit)
    return int(sum(bucket.get() for bucket in child._buckets))


def context_of(sidecar: Sidecar, authorization: str) -> str:
    """The authorization context the sidecar names a client sending this `Authorization` (and nothing else)."""
    return sidecar.app[IDENTITIES].of({"Authorization": authorization}).context
