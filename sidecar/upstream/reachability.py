"""Whether the upstream can be used now, whichever leg reaches it: reachable (`up`, `last_error`), usable (its
answers are MCP), its era known (`info`), heard from lately (readiness freshness); every exchange counted and
timed.

Two legs tell it differently. Over HTTP every exchange does (the leg gives a `retry` at construction): any answer
means up, a transport failure means down; while down the sidecar asks again on its own with `retry`, at the pace of
`Outage` (which also says what the log says), so recovery is noticed, and told to its recovery listeners, without
waiting for a client or a readiness probe. Unusable is never a resting state either: while the upstream answers but
cannot be used, it is asked again at the same backed-off pace (a fresh session each time). Recovery is told once the
upstream is both reachable and usable again, so every watch looks again when its look can succeed (a look spent on
an upstream that came back unusable would leave the watch waiting out its backoff).

A stdio server's supervisor tells it instead (`handshake_answered`, `not_answering`): the child is up from its
handshake until it ends, and the supervisor's reason says when it is started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from types import TracebackType
from typing import Any

from sidecar.backoff import Backoff
from sidecar.listeners import Listeners
from sidecar.observability.metrics import Metrics, method_label
from sidecar.protocol import UpstreamError, UpstreamHTTPError
from sidecar.upstream.answers import UpstreamInfo
from sidecar.upstream.outage import RETRY_INITIAL_S, RETRY_MAX_S, Outage

__all__ = ["READY_FRESH_S", "Exchanging", "Reachability"]

logger = logging.getLogger("sidecar.upstream")

READY_FRESH_S = 2.0
"""A readiness check trusts an upstream heard from this recently; otherwise it is asked again."""
_UNUSABLE_PACE = Backoff(RETRY_INITIAL_S, RETRY_MAX_S)
"""How often an upstream that answers but cannot be used is asked again: the pace of an outage's retries."""


class Reachability:
    """Reachability, usability and the era of one upstream, and the count of its exchanges."""

    def __init__(self, url: str, metrics: Metrics, *, retry: Callable[[], Awaitable[None]] | None = None) -> None:
        """`retry`: given where every exchange tells reachability (HTTP), one exchange with the upstream over the
        network, tried at the outage's pace while it is down (and while it is unusable); None where the leg tells
        it itself (a stdio supervisor)."""
        self.url = url
        self._metrics = metrics
        self._retry = retry
        self._follows_exchanges = retry is not None
        self.info: UpstreamInfo | None = None
        """The era and capabilities; None while not known (over HTTP also while down: probed afresh then)."""
        self.up: bool | None = None
        """True while the upstream answers; False while it does not; None before the first try."""
        self.last_error: str | None = None
        self.unusable: str | None = None
        """Why an upstream that answers cannot be used (its probe answer was not MCP), or None."""
        self.auth_required = False
        """The upstream refused an anonymous probe with 401/403: it works, and needs client credentials."""
        self.heard_at = 0.0
        """When the upstream last answered (monotonic): readiness trusts it for READY_FRESH_S."""
        self._recovery_listeners: Listeners[Callable[[], None]] = Listeners()
        """Told when the upstream can be used again after being unreachable or unusable (`add_recovery_listener`)."""
        self.outages = 0
        """How many outages began (an HTTP upstream's sessions from before the last one may be forgotten)."""
        self._outage = Outage(url)
        self._handshakes = 0
        self._retrying: asyncio.Task[None] | None = None
        self._retrying_unusable: asyncio.Task[None] | None = None
        self._probing: asyncio.Task[None] | None = None
        self._recovery_due = False
        """An outage ended while the upstream's era was not known again: recovery is told once it is usable."""
        self._changed = asyncio.Event()
        self._series_cache: dict[tuple[str, str], tuple[Any, Any]] = {}

    # -- what consumers read -------------------------------------------------------------------------------

    @property
    def retry_in_s(self) -> float | None:
        """Seconds until the sidecar asks the unreachable upstream again; None while it is not down (and for a
        stdio server, whose restart is said in `last_error`)."""
        return self._outage.retry_in_s if self.up is False and self._follows_exchanges else None

    @property
    def not_ready_reason(self) -> str | None:
        """Why the sidecar cannot serve now (None when it can): unreachable, unusable, or not reached yet."""
        if self.up is False:
            return self.last_error or "upstream unreachable"
        if self.unusable is not None:
            return self.unusable
        if self.info is None and not self.auth_required:
            return self.last_error or "upstream not reached yet"
        return None

    def stale(self, heard_at: float | None = None) -> bool:
        """Readiness asks the upstream again: it has not been heard from (at `heard_at`, when the leg knows
        better) within READY_FRESH_S."""
        return time.monotonic() - (self.heard_at if heard_at is None else heard_at) > READY_FRESH_S

    async def reached(self) -> UpstreamInfo:
        """The era and capabilities once the upstream has answered, waiting (however long) until it has."""
        while self.info is None or self.up is False:
            self._changed.clear()
            await self._changed.wait()
        return self.info

    # -- what the era probe tells ----------------------------------------------------------------------------

    def learned(self, info: UpstreamInfo) -> None:
        """A probe learned the era."""
        self._know(info)
        self.auth_required = False
        self.usable(None)
        self._metrics.upstream_speaks(info.revision)
        logger.info("upstream era detected", extra={"era": info.revision, "upstream": self.url})

    def probe_failed(self, exc: UpstreamError) -> None:
        if exc.is_transport_failure:
            return  # down, not unusable: `observe` says so
        if isinstance(exc, UpstreamHTTPError) and exc.is_auth_failure:
            # A protected upstream answers an anonymous probe so: it works, and its era is learned with the
            # first client credential.
            self.auth_required = True
            self.usable(None)
            return
        self.usable(f"the upstream answers but is unusable: {exc.reason}")

    def liveness_failed(self, exc: UpstreamError) -> None:
        """A liveness check in the era known failed: as a probe's failure, and an upstream found unusable has its
        era probed afresh once it answers sensibly again."""
        self.probe_failed(exc)
        if self.unusable is not None:
            self.info = None

    def usable(self, problem: str | None) -> None:
        was = self.unusable
        if problem is not None and problem != was:
            logger.warning("upstream unusable", extra={"upstream": self.url, "reason": problem})
        elif problem is None and was is not None:
            logger.info("upstream usable again", extra={"upstream": self.url})
        self.unusable = problem
        self._metrics.upstream_usable.set(0 if problem is not None else 1)
        if problem is not None:
            self._retry_unusable()
        elif was is not None or self._recovery_due:
            self._recovered()

    # -- what a stdio supervisor tells -------------------------------------------------------------------------

    def handshake_answered(self, info: UpstreamInfo) -> None:
        """A child answered its handshake: up, in the era it said; after a restart, reachable again."""
        again, self._handshakes = self._handshakes > 0, self._handshakes + 1
        self.up = True
        self.last_error = None
        self._know(info)
        if again:
            logger.info("upstream reachable again", extra={"upstream": self.url})
            self._tell_recovered()

    def not_answering(self, reason: str, *, down: bool) -> None:
        """The child is not ready (`down`: ended, waiting to be started again; else starting or closing)."""
        self.up = False if down or self._handshakes else None
        self.last_error = reason

    # -- every exchange ----------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def observe(self, method: str) -> Iterator[None]:
        """Count and time one exchange; over HTTP also track reachability: any answer means up, a transport
        failure means down and a re-probe on the next request."""
        started = time.monotonic()
        outcome = "ok"
        try:
            yield
        except UpstreamError as exc:
            outcome = "unreachable" if exc.is_transport_failure else "error"
            if self._follows_exchanges:
                if exc.is_transport_failure:
                    self._went_down(exc.reason)
                else:
                    self._answered()
            raise
        else:
            if self._follows_exchanges:
                self._answered()
        finally:
            counter, histogram = self._series(method_label(method), outcome)
            counter.inc()
            histogram.observe(time.monotonic() - started)

    def stop_retrying(self) -> None:
        for task in (self._retrying, self._retrying_unusable, self._probing):
            if task is not None:
                task.cancel()
        self._retrying = self._retrying_unusable = self._probing = None

    def _know(self, info: UpstreamInfo) -> None:
        self.info = info
        self._changed.set()

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
        # The era is probed afresh once it answers: over the network, never from a cached session.
        if self.up is not False:
            self.outages += 1
        self._outage.failed(reason)
        self.up = False
        self.last_error = reason
        self.info = None
        if self._retrying is None and self._retry is not None:
            self._retrying = asyncio.get_running_loop().create_task(self._retry_while_down(self._retry))

    def _answered(self) -> None:
        self.up = True
        self.heard_at = time.monotonic()
        self.last_error = None
        if self._outage.answered():
            self._recovery_due = True
            if self.info is not None and self.unusable is None:
                self._recovered()
            elif self._retry is not None and self._probing is None:  # `usable` tells once a probe finds it usable
                self._probing = asyncio.get_running_loop().create_task(self._probe_after_outage(self._retry))

    def _recovered(self) -> None:
        self._recovery_due = False
        self._tell_recovered()  # every watch that failed meanwhile looks again now

    def add_recovery_listener(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Tell `listener` each time the upstream can be used again; returns an idempotent remover."""
        return self._recovery_listeners.add(listener)

    def _tell_recovered(self) -> None:
        for listener in self._recovery_listeners:
            listener()

    async def _retry_while_down(self, retry: Callable[[], Awaitable[None]]) -> None:
        try:
            while self.up is False:
                await asyncio.sleep(self._outage.retry_in_s)
                if self.up is False:  # nothing else reached it meanwhile
                    with contextlib.suppress(UpstreamError):
                        await retry()
        finally:
            if self._retrying is asyncio.current_task():
                self._retrying = None

    async def _probe_after_outage(self, retry: Callable[[], Awaitable[None]]) -> None:
        try:
            # Unless the exchange that ended the outage was the probe itself (which has learned the era by now).
            if self._recovery_due and self.info is None:
                with contextlib.suppress(UpstreamError):
                    await retry()
        finally:
            self._probing = None

    def _retry_unusable(self) -> None:
        if self._retrying_unusable is None and self._retry is not None:
            retry = self._retry
            self._retrying_unusable = asyncio.get_running_loop().create_task(self._retry_while_unusable(retry))

    async def _retry_while_unusable(self, retry: Callable[[], Awaitable[None]]) -> None:
        attempts = 0
        try:
            while self.unusable is not None:
                attempts += 1
                await asyncio.sleep(_UNUSABLE_PACE.delay(attempts))
                if self.unusable is not None and self.up is not False:  # while down, the outage's retries ask
                    with contextlib.suppress(UpstreamError):
                        await retry()
        finally:
            if self._retrying_unusable is asyncio.current_task():
                self._retrying_unusable = None


class Exchanging:
    """One exchange for the block, counted and timed by `Reachability.observe`, and the era it goes in: `era`
    awaited before the count starts (`era_first`: over HTTP a probe is an exchange of its own) or within it (a
    stdio child's handshake, waited for as part of the exchange). A class rather than a generator: it is on every
    forwarded request."""

    __slots__ = ("_era", "_era_first", "_observed")

    def __init__(
        self,
        observed: contextlib.AbstractContextManager[None],
        era: Callable[[], Awaitable[UpstreamInfo]],
        *,
        era_first: bool,
    ) -> None:
        self._observed = observed
        self._era = era
        self._era_first = era_first

    async def __aenter__(self) -> UpstreamInfo:
        if self._era_first:
            info = await self._era()
            self._observed.__enter__()
            return info
        self._observed.__enter__()
        try:
            return await self._era()
        except BaseException as exc:
            self._observed.__exit__(type(exc), exc, exc.__traceback__)
            raise

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> bool | None:
        return self._observed.__exit__(kind, exc, traceback)
