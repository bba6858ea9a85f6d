"""`mcp-sidecar run`'s serving: the listeners up, then serve until SIGTERM or SIGINT and shut down in order; and
`--workers N` as N processes sharing the port."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence

from aiohttp import web

from sidecar.admin import HINT_TOKEN
from sidecar.app import ADMIN, METRICS, UPSTREAM, build_app
from sidecar.bus.redis import RedisUnavailable
from sidecar.config import SidecarConfig
from sidecar.observability.logs import INSTANCE_ENV, log_configuration
from sidecar.observability.tracing import TracingUnavailable, configure_tracing, install, tracing
from sidecar.serving import GuardedRunner, install_quiet_errors, raise_open_files_limit, settle_heap, stop_signals
from sidecar.tls import CertificateWatch, server_context
from sidecar.upstream.http.client import UpstreamClient
from sidecar.upstream.stdio.process import StdioStartError

__all__ = ["WORKER_ENV", "run_workers", "serve", "serve_settled"]

logger = logging.getLogger(__name__)

WORKER_ENV = "MCP_SIDECAR_WORKER"
"""Set in each worker process of `--workers N`: it serves, it does not start workers of its own."""
_FILES_BESIDES_CLIENTS = 1024
"""Open files the sidecar needs besides client connections: upstream pool, Redis, logs, the admin listener."""
_ADMIN_CONNECTIONS = 64
"""Scrapers and probes: a handful of connections; more is a client that should not be there."""
_CERTIFICATE_CHECK_S = 10.0
"""How often the certificate files in use are looked at for a change."""


async def serve_settled(config: SidecarConfig, *, reuse_port: bool) -> int:
    # The process's own heap only: `serve` also runs inside test processes, whose heap is not the sidecar's.
    ready = asyncio.Event()

    async def settle() -> None:
        await ready.wait()
        settle_heap()

    settling = asyncio.get_running_loop().create_task(settle())
    try:
        return await serve(config, ready, reuse_port=reuse_port)
    except Exception as exc:
        if ready.is_set():
            raise
        # What the configuration check cannot know (a file changed since, a resource of the host): one line, the
        # traceback only for whoever asked for debug logs.
        logger.debug("start-up failed", exc_info=True)
        print(f"mcp-sidecar: start-up: {exc or type(exc).__name__} (--log-level debug shows where)", file=sys.stderr)
        return 1
    finally:
        settling.cancel()


def run_workers(count: int, argv: Sequence[str]) -> int:
    """Start `count` worker processes on one port and forward SIGTERM/SIGINT (stop) and SIGHUP (read the
    certificate files again) to them until all exit."""
    env = {**os.environ, WORKER_ENV: "1"}
    command = [sys.executable, "-m", "sidecar.cli", *argv]
    named = os.environ.get(INSTANCE_ENV)  # each worker is a replica of its own: a name of its own too
    children = [
        subprocess.Popen(command, env={**env, INSTANCE_ENV: f"{named}-{n}"} if named else env) for n in range(count)
    ]

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGHUP, forward)  # its default action would end this process, and the workers with it
    codes = [child.wait() for child in children]
    return max(codes, default=0)


async def serve(config: SidecarConfig, ready: asyncio.Event | None = None, *, reuse_port: bool = False) -> int:
    """Serve until SIGTERM or SIGINT, then shut down in order: streams end, requests drain, parts close."""
    loop = asyncio.get_running_loop()
    install_quiet_errors(loop)
    try:
        traced = configure_tracing(config.tracing)
    except TracingUnavailable as exc:
        print(f"mcp-sidecar: tracing: {exc}", file=sys.stderr)
        return 1
    if traced is not None:
        install(traced)
    try:
        return await _serve(config, ready, reuse_port=reuse_port)
    finally:
        tracing().shutdown()  # what is buffered goes to the collector before the exit


async def _serve(config: SidecarConfig, ready: asyncio.Event | None, *, reuse_port: bool) -> int:
    loop = asyncio.get_running_loop()
    config = config.model_copy(update={"listen": raise_open_files_limit(config.listen, _FILES_BESIDES_CLIENTS)})
    app = build_app(config)
    metrics = app[METRICS]
    runner = GuardedRunner(
        app,
        config.listen,
        metrics,
        handler_cancellation=True,
        shutdown_timeout=config.listen.shutdown_grace_s,
        access_log=None,
    )
    admin_runner = GuardedRunner(
        app[ADMIN], config.listen.model_copy(update={"max_connections": _ADMIN_CONNECTIONS}), metrics, access_log=None
    )
    try:
        await runner.setup()
    except RedisUnavailable as exc:
        print(f"mcp-sidecar: {exc} (set bus.fallback: local to start without it)", file=sys.stderr)
        await runner.cleanup()
        return 1
    except StdioStartError as exc:
        print(f"mcp-sidecar: upstream.command: {exc}", file=sys.stderr)
        await runner.cleanup()
        return 1
    await admin_runner.setup()
    certificates = CertificateWatch()
    upstream = app[UPSTREAM]
    if isinstance(upstream, UpstreamClient) and config.upstream.url.startswith("https://"):
        certificates.upstream(config.upstream.tls, upstream.use_tls)
    for name, site_runner, host, port, tls in (
        ("listen", runner, config.listen.host, config.listen.port, config.listen.tls),
        ("admin", admin_runner, config.admin.host, config.admin.port, config.admin.tls),
    ):
        try:
            context = server_context(tls)
        except (OSError, ssl.SSLError, ValueError) as exc:
            await admin_runner.cleanup()
            await runner.cleanup()
            print(f"mcp-sidecar: {name}.tls: cannot load the certificate files: {exc}", file=sys.stderr)
            return 1
        if context is not None:
            certificates.listener(name, context, tls)
        try:
            site = web.TCPSite(
                site_runner,
                host,
                port,
                reuse_port=reuse_port or None,
                backlog=config.listen.backlog,
                ssl_context=context,
            )
            await site.start()
        except OSError as exc:
            await admin_runner.cleanup()
            await runner.cleanup()
            print(f"mcp-sidecar: {name}: cannot listen on {host}:{port}: {exc.strerror}", file=sys.stderr)
            return 1
    watcher = loop.create_task(_watch_certificates(certificates)) if certificates.watching else None
    try:
        # The handlers go in before the line that says the sidecar listens: a supervisor that sends SIGTERM as
        # soon as it reads that line gets a clean shutdown, not the default action's death.
        hint_token = app[ADMIN].get(HINT_TOKEN)
        reloads = [certificates.reload] + ([hint_token.reload] if hint_token is not None else [])
        with stop_signals() as stop, _reload_on_sighup(reloads):
            log_configuration(config)  # secrets masked: never a token, a header value or a password
            for warning in config.warnings():
                logger.warning(warning)
            logger.info(
                "mcp-sidecar listening",
                extra={
                    "event_loop": type(loop).__module__.split(".")[0],  # uvloop or asyncio
                    "url": _url(runner, config.listen.path, config.listen.tls.enabled),
                    "admin": _url(admin_runner, config.metrics.path, config.admin.tls.enabled),
                    "upstream": config.upstream.display_url,
                },
            )
            if ready is not None:
                ready.set()
            await stop.wait()
    finally:
        if watcher is not None:
            watcher.cancel()
        logger.info("shutting down")
        await runner.cleanup()
        await admin_runner.cleanup()
    return 0


def _url(runner: web.AppRunner, path: str, tls: bool = False) -> str:
    host, port = runner.addresses[0][:2]
    url_host = f"[{host}]" if ":" in host else host  # an IPv6 address needs brackets in a URL
    return f"{'https' if tls else 'http'}://{url_host}:{port}{path}"


async def _watch_certificates(certificates: CertificateWatch) -> None:
    # Rotated certificate files (cert-manager, a mounted Secret) are picked up without a restart or a SIGHUP.
    while True:
        await asyncio.sleep(_CERTIFICATE_CHECK_S)
        try:
            certificates.check()
        except Exception:  # boundary: a surprise in one check must not stop every later one
            logger.exception("checking the certificate files failed")


@contextlib.contextmanager
def _reload_on_sighup(reloads: Sequence[Callable[[], None]]) -> Iterator[None]:
    """SIGHUP reads the files in use again: the certificates, and the token of POST /hints."""

    def reload() -> None:
        for each in reloads:
            try:
                each()
            except Exception:  # boundary: one reload failing must not keep the others from running
                logger.exception("reloading on SIGHUP failed")

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, reload)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(signal.SIGHUP)
