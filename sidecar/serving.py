"""Serving the sidecar's HTTP listeners against hostile clients: connection caps, timeouts, quiet error logs.

- A client has `listen.header_timeout_s` to send a complete request on a new or idle connection
  (aiohttp's keep-alive timer, armed when a connection opens, closes a connection waiting for a request);
  the body then has `listen.body_timeout_s` (see `downstream/guards.read_body`).
- At most `listen.max_connections` connections at once: one more is closed as it is accepted, counted
  in `mcp_sidecar_limit_rejections_total{limit="max_connections"}`; established streams go on, and the
  admin listener (health, metrics) has its own.
- The soft limit on open files is raised to the hard limit at start, so the cap, not the kernel, decides; where
  the hard limit is lower than the cap needs (1,024 under some runtimes), the cap is lowered to fit it.
- asyncio's "accept() out of resources" and aiohttp's tracebacks for malformed HTTP are logged once per
  cause per interval at WARNING, not once per connection at ERROR.
- Once serving, the heap the process started with is left out of garbage collection (`settle_heap`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import resource
import signal
import time
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from sidecar.config import ListenConfig
from sidecar.observability.metrics import Metrics

__all__ = [
    "GuardedRunner",
    "QuietErrors",
    "install_quiet_errors",
    "raise_open_files_limit",
    "settle_heap",
    "stop_signals",
]

logger = logging.getLogger(__name__)

_LOG_INTERVAL_S = 10.0
GC_YOUNG_THRESHOLD = 20_000
"""Net new container objects between young collections (CPython's default is 700). Almost everything a request
allocates is freed by reference counting; at 700 a collection ran every ~20 requests at c=32, and the objects
of the requests in flight were promoted and later rescanned by full collections."""


def settle_heap() -> None:
    """Called once the sidecar serves: what is alive now (modules, configuration, the app) lives as long as the
    process, so the collector stops scanning it (`gc.freeze`), and young collections run every
    `GC_YOUNG_THRESHOLD` net allocations. Measured under load at c=32: collections took ~2% of the CPU and paused
    the loop for up to 66 ms (full ones scanning the startup heap), the p99's size; after, almost none ran."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


class GuardedRunner(web.AppRunner):
    """An AppRunner whose server closes connections past `listen.max_connections` as they are accepted and
    gives each new or idle connection `listen.header_timeout_s` to send a complete request."""

    def __init__(self, app: web.Application, config: ListenConfig, metrics: Metrics, **kwargs: Any) -> None:
        kwargs.setdefault("keepalive_timeout", config.header_timeout_s)
        super().__init__(app, **kwargs)
        self._max_connections = config.max_connections
        self._metrics = metrics

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        accept = server.connection_made
        cap = self._max_connections
        rejected = self._metrics.limit_rejections.labels("max_connections")

        def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
            accept(handler, transport)
            if len(server.connections) > cap:
                rejected.inc()
                transport.abort()  # before a byte is read: a flood costs an accept and a close, nothing more

        # aiohttp's Server has no hook for this; its protocol calls `connection_made` on the instance.
        server.connection_made = connection_made  # type: ignore[method-assign]
        return server


class QuietErrors(logging.Filter):
    """Lets one record per cause through per interval, at WARNING, without its traceback."""

    def __init__(self, interval_s: float = _LOG_INTERVAL_S) -> None:
        super().__init__()
        self._interval_s = interval_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        cause = type(exc).__name__ if exc is not None else record.getMessage()[:80]
        now = time.monotonic()
        if now - self._last.get(cause, -self._interval_s) < self._interval_s:
            self._suppressed[cause] = self._suppressed.get(cause, 0) + 1
            return False
        self._last[cause] = now
        suppressed = self._suppressed.pop(cause, 0)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.msg = f"{record.getMessage()}: {exc}" if exc is not None else record.getMessage()
        record.args = None
        record.exc_info = record.exc_text = None
        if suppressed:
            record.msg += f" ({suppressed} more like it in the last {self._interval_s:.0f} s)"
        if len(self._last) > 1000:  # causes are a small set; keep the memo bounded anyway
            self._last.clear()
        return True


def install_quiet_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Malformed HTTP (aiohttp) and failed accepts (asyncio) are logged at most once per cause per interval."""
    server_logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, QuietErrors) for f in server_logger.filters):
        server_logger.addFilter(QuietErrors())
    quiet = QuietErrors()
    default = loop.get_exception_handler()

    def on_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if "accept" not in str(context.get("message", "")):
            if default is not None:
                default(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        exc = context.get("exception")
        record = logger.makeRecord(logger.name, logging.ERROR, __file__, 0, "%s", (context.get("message"),), None)
        if exc is not None:
            record.exc_info = (type(exc), exc, exc.__traceback__)
        if quiet.filter(record):
            logger.handle(record)

    loop.set_exception_handler(on_exception)


def raise_open_files_limit(listen: ListenConfig, besides: int) -> ListenConfig:
    """Raise the soft open-files limit towards the hard one, for `listen.max_connections` clients and `besides`
    other files; `listen`, its cap lowered to what the limit leaves when it stays below (see `_fitted`)."""
    wanted = listen.max_connections + besides
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, wanted)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            logger.warning("cannot raise the open-files limit", extra={"soft": soft, "hard": hard, "reason": str(exc)})
    if soft >= wanted:
        return listen
    fitted = _fitted(soft, besides)
    logger.info(
        "listen.max_connections lowered to fit the open-files limit (raise it: --ulimit nofile=N:N, LimitNOFILE)",
        extra={"limit": soft, "max_connections": fitted, "configured": listen.max_connections},
    )
    return listen.model_copy(update={"max_connections": fitted})


def _fitted(limit: int, besides: int) -> int:
    """Client connections under an open-files `limit` that `besides` other files would not leave room for: what
    remains after them, or after half the limit when they would take more (1,024 files: 512 clients), so the cap
    closes excess connections at accept before the kernel refuses them."""
    return max(1, limit - min(besides, limit // 2))


@contextlib.contextmanager
def stop_signals() -> Iterator[asyncio.Event]:
    """An event SIGTERM and SIGINT set while the block runs; after it, they act as usual again (a second Ctrl-C
    during the cleanup that follows interrupts it)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        yield stop
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)
