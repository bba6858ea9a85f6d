"""Whether the upstream can be used now: reachable, usable (its answers are MCP), its era known; counted and
timed per exchange. The base of `UpstreamClient`, which adds how to reach it (`_reach`).

While it is unreachable the sidecar asks it again on its own, at the pace of `Outage` (which also says what the
log says): recovery is noticed, and told to `on_recovered`, without waiting for a client or a readiness probe."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from sidecar.observability.metrics import Metrics, method_label
from sidecar.protocol.errors import UpstreamError, UpstreamHTTPError
from sidecar.upstream.answers import UpstreamInfo
from sidecar.upstream.outage import Outage

__all__ = ["UpstreamState"]

logger = logging.getLogger(__name__)


class UpstreamState:
    """Reachability (`up`, `last_error`), usability (`unusable`, `auth_required`) and the era (`info`)."""

    def __init__(self, url: str, metrics: Metrics) -> None:
        self.url = url
        self._metrics = metrics
        self._info: UpstreamInfo | None = None
        self._series_cache: dict[tuple[str, str], tuple[Any, Any]] = {}
        self.up: bool | None = None
        """True once the upstream answered; False while it is unreachable; None before the first try."""
        self.last_error: str | None = None
        self.unusable: str | None = None
        """Why an upstream that answers cannot be used (its probe answer was not MCP), or None."""
        self.auth_required = False
        """The upstream refused an anonymous probe with 401/403: it works, and needs client credentials."""
        self._last_ok = 0.0
        self.on_recovered: Callable[[], None] | None = None
        """Called when the upstream answers again after being unreachable."""
        self._outage = Outage(url)
        self._retrying: asyncio.Task[None] | None = None
        self._known = asyncio.Event()
        """Set while the era is known (`info`): what `reached` waits for."""

    @property
    def info(self) -> UpstreamInfo | None:
        return self._info

    @property
    def retry_in_s(self) -> float | None:
        """Seconds until the sidecar asks the unreachable upstream again; None while it is not down."""
        return self._outage.retry_in_s if self.up is False else None

    async def reached(self) -> UpstreamInfo:
        """The era and capabilities once a probe has succeeded, waiting (however long) until one has."""
        while self._info is None:
            self._known.clear()
            await self._known.wait()
        return self._info

    async def _reach(self) -> None:
        """One exchange with the upstream over the network (a probe, or a liveness check when the era is known);
        an UpstreamError when it fails."""
        raise NotImplementedError

    def _down(self) -> bool:
        return self.up is False

    def _stop_retrying(self) -> None:
        if self._retrying is not None:
            self._retrying.cancel()
            self._retrying = None

    async def _retry_while_down(self) -> None:
        try:
            while self._down():
                await asyncio.sleep(self._outage.retry_in_s)
                if self._down():  # nothing else reached it meanwhile
                    with contextlib.suppress(UpstreamError):
                        await self._reach()
        finally:
            if self._retrying is asyncio.current_task():
                self._retrying = None

    def _set_info(self, info: UpstreamInfo) -> None:
        self._info = info
        self._known.set()
        self.auth_required = False
        self._usable(None)
        self._metrics.upstream_speaks(info.revision)
        logger.info("upstream era detected", extra={"era": info.revision, "upstream": self.url})

    def _probe_failed(self, exc: UpstreamError) -> None:
        if exc.is_transport_failure:
            return  # down, not unusable: `_observe` says so
        if isinstance(exc, UpstreamHTTPError) and exc.is_auth_failure:
            # A protected upstream answers an anonymous probe so: it works, and its era is learned with the
            # first client credential.
            self.auth_required = True
            self._usable(None)
            return
        self._usable(f"the upstream answers but is unusable: {exc.reason}")

    def _usable(self, problem: str | None) -> None:
        if problem is not None and problem != self.unusable:
            logger.warning("upstream unusable", extra={"upstream": self.url, "reason": problem})
        elif problem is None and self.unusable is not None:
            logger.info("upstream usable again", extra={"upstream": self.url})
        self.unusable = problem
        self._metrics.upstream_usable.set(0 if problem is not None else 1)

    @property
    def not_ready_reason(self) -> str | None:
        """Why the sidecar cannot serve now (None when it can): unreachable, unusable, or not probed yet."""
        if self.up is False:
            return self.last_error or "upstream unreachable"
        if self.unusable is not None:
            return self.unusable
        if self._info is None and not self.auth_required:
            return "upstream not reached yet"
        return None

    @contextlib.contextmanager
    def _observe(self, method: str) -> Iterator[None]:
        """Count and time one exchange, and track reachability: any answer means up; a transport failure
        means down and a re-probe on the next request."""
        started = time.monotonic()
        label = method_label(method)
        outcome = "ok"
        try:
            yield
        except UpstreamError as exc:
            outcome = "unreachable" if exc.is_transport_failure else "error"
            if exc.is_transport_failure:
                self._went_down(exc.reason)
            else:
                self._mark_up()
            raise
        else:
            self._mark_up()
        finally:
            counter, histogram = self._series(label, outcome)
            counter.inc()
            histogram.observe(time.monotonic() - started)

    def _series(self, label: str, outcome: str) -> tuple[Any, Any]:
        # Resolving labelled children costs more than the observation itself; keep them.
        key = (label, outcome)
        series = self._series_cache.get(key)
        if series is None:
            series = (
                self._metrics.upstream_requests.labels(label, outcome),
                self._metrics.upstream_duration.labels(label),
            )
            self._series_cache[key] = series
        return series

    def _went_down(self, reason: str) -> None:
        # The era is probed afresh once it answers: over the network, never from a cached session (`_reach`).
        self._outage.failed(reason)
        self.up = False
        self.last_error = reason
        self._info = None
        if self._retrying is None:
            self._retrying = asyncio.get_running_loop().create_task(self._retry_while_down())

    def _mark_up(self) -> None:
        self.up = True
        self._last_ok = time.monotonic()
        self.last_error = None
        if self._outage.answered() and self.on_recovered is not None:
            self.on_recovered()
