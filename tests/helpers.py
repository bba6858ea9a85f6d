"""Shared test helpers: a sidecar served on a free loopback port, and raw MCP HTTP/SSE calls."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from sidecar.app import ADMIN, IDENTITIES, METRICS, build_app
from sidecar.config import SidecarConfig
from sidecar.serving import GuardedRunner, install_quiet_errors
from sidecar.tls import server_context

PV = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": PV,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "tests", "version": "0"},
}
SUB_ID_KEY = "io.modelcontextprotocol/subscriptionId"
LEGACY_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}
"""A 2025-11-25 client's first message, as raw JSON."""
LEGACY_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
"""The headers of a 2025-11-25 client's POST (plus Mcp-Session-Id and MCP-Protocol-Version after initialize)."""


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


def headers(method: str, name: str | None = None, **extra: str) -> dict[str, str]:
    h = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": PV,
        "Mcp-Method": method,
    }
    if name is not None:
        h["Mcp-Name"] = name
    h.update(extra)
    return h


def request(method: str, params: dict[str, Any] | None = None, request_id: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**(params or {}), "_meta": META}}


async def rpc(
    session: aiohttp.ClientSession,
    url: str,
    method: str,
    params: dict[str, Any] | None = None,
    *,
    request_id: Any = 1,
    extra_headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    """One modern request with correct headers; returns (HTTP status, JSON-RPC message)."""
    name = None
    if method in ("tools/call", "prompts/get"):
        name = (params or {}).get("name")
    elif method == "resources/read":
        name = (params or {}).get("uri")
    async with session.post(
        url, json=request(method, params, request_id), headers=headers(method, name, **(extra_headers or {}))
    ) as resp:
        return resp.status, await resp.json(content_type=None)


async def sse_messages(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """JSON messages of an SSE response, one per event; comment lines are skipped."""
    data: list[str] = []
    async for raw in resp.content:
        line = raw.decode().rstrip("\r\n")
        if line == "":
            if data:
                yield json.loads("\n".join(data))
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))


async def eventually(check: Callable[[], bool | Awaitable[bool]], within_s: float = 15.0, step: float = 0.02) -> None:
    """Wait until `check()` is true: for state that has no event to await (a gauge, a count, a status)."""
    async with asyncio.timeout(within_s):
        while True:
            outcome = check()
            if isinstance(outcome, Awaitable):
                outcome = await outcome
            if outcome:
                return
            await asyncio.sleep(step)  # polling an outside observable, bounded
