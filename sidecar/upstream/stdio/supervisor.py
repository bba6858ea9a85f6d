"""Keeps one initialized stdio server running: start, handshake, restart with capped backoff, liveness.

States: `starting` (spawned, handshake not yet answered; requests wait for it), `ready`, `down`
(ended, waiting out the backoff before the next start; requests fail at once with the reason, which
/readyz shows too) and `closed`. Until a child answers its handshake, the reason keeps how the last one
ended (its exit, its last stderr line, when, the restarts so far), in `starting` as in `down`: a crash
loop says why in every sample; the stderr of a child started after one that ended is logged at warning,
as are a child's last lines once it has exited. The child ends by exiting, by closing its stdout, or by failing a
liveness probe: a request that timed out makes the supervisor ask the child something cheap (`ping`;
`server/discover` at 2026-07-28) within `upstream.connect_timeout_s`, and a child that cannot answer
that is ended (its process group) and started again. The handshake speaks whichever era the child
does: `server/discover` first (auto), else `initialize`; a child that exits after reading `server/discover`
is started again with `initialize` first. Every start asks afresh: one that died before reading its request
(a failed download, a missing key) says nothing about the era, and a restarted command may be a newer server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Literal

from sidecar.backoff import Backoff
from sidecar.config import UpstreamConfig
from sidecar.listeners import Listeners
from sidecar.observability.metrics import Metrics
from sidecar.protocol import JsonObject, ShuttingDown, UpstreamBusy, UpstreamError, UpstreamTimeout, UpstreamUnavailable
from sidecar.tasks import TaskSet
from sidecar.upstream.answers import UpstreamInfo
from sidecar.upstream.base import NotificationListener
from sidecar.upstream.era import own_request_params
from sidecar.upstream.probe import INITIALIZE_PARAMS, initialize_result, learn_era
from sidecar.upstream.reachability import Reachability
from sidecar.upstream.stdio.child import StdioChild
from sidecar.upstream.stdio.process import REACH_ENVIRONMENT, StdioStartError, child_environment

__all__ = ["StdioSupervisor", "SupervisorState"]

logger = logging.getLogger(__name__)

SupervisorState = Literal["starting", "ready", "down", "closed"]

STABLE_AFTER_S = 60.0
"""A child that served this long before it ended restarts at the initial backoff again, not the last one."""
_DISCOVER_PARAMS: JsonObject = own_request_params({})
_STARTING = "starting: waiting for the stdio server to answer its handshake"
_ENVIRONMENT_HINT = (
    "the command gets only PATH, HOME, locale, the proxy and CA variables and upstream.inherit_env of the "
    "sidecar's environment, and upstream.env; pass more with upstream.inherit_env or --upstream-env NAME[=VALUE]"
)


class StdioSupervisor:
    """The child session every client shares, kept alive."""

    def __init__(self, config: UpstreamConfig, metrics: Metrics, reachability: Reachability) -> None:
        self.label = config.display_url
        self._config = config
        self._metrics = metrics
        self._reach = reachability
        self._restarts = Backoff(
            config.restart_backoff_initial_ms / 1000, config.restart_backoff_max_ms / 1000, jitter=0.2
        )
        self.state: SupervisorState = "starting"
        self.reason: str | None = _STARTING
        """Why the child is not ready, in words (None while it is)."""
        reachability.not_answering(_STARTING, down=False)
        self.info: UpstreamInfo | None = None
        self.handshake: JsonObject = {}
        """The child's answer to the handshake: its `server/discover` or `initialize` result."""
        self.child: StdioChild | None = None
        self.ever_ready = False
        self._settled = asyncio.Event()
        self._ready_at = 0.0
        self._ending: dict[StdioChild, tuple[str, str]] = {}
        """Why the supervisor itself ended a child: (reason in words, restart metric label)."""
        self._discover_ends_child = False
        """The last child died after reading server/discover: the next start (that one only) gets initialize first."""
        self._last_exit: str | None = None
        """How the last child ended, when, and the restarts so far, in words: said beside `starting` until a child
        answers its handshake, so a crash loop says why in every sample, not only while it is `down`."""
        self._restarted = 0
        """Children started again since the sidecar started (each counted in mcp_sidecar_upstream_restarts_total)."""
        self._env: dict[str, str] = {}
        self._probe: asyncio.Task[bool] | None = None
        self._runner: asyncio.Task[None] | None = None
        self._listeners: Listeners[NotificationListener] = Listeners()
        self._aborted = False
        self._terminations = TaskSet("ending a stdio server failed", logger)

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the child (StdioStartError when its program cannot run at all); the handshake goes on behind."""
        child = await self._spawn()
        self._runner = asyncio.get_running_loop().create_task(self._run(child))

    async def aclose(self) -> None:
        """End the child's whole process group: SIGTERM, then SIGKILL after `upstream.stop_grace_s`."""
        self._enter("closed", "the sidecar is shutting down")
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        if self._probe is not None:
            self._probe.cancel()
        if self.child is not None:
            self.child.fail_all(ShuttingDown(self.label, "the sidecar is shutting down"))
            await self.child.terminate(self._config.stop_grace_s)
            logger.info("stdio server stopped", extra={"upstream": self.label, "pid": self.child.pid})

    def abort_all(self) -> None:
        """Shutdown is near its end: requests in flight fail now with ShuttingDown, and new ones are refused."""
        self._aborted = True
        if self.child is not None:
            self.child.fail_all(ShuttingDown(self.label, "the sidecar is shutting down"))

    async def session(self, *, wait: bool = True) -> tuple[StdioChild, UpstreamInfo]:
        """The ready child and what its handshake said; waits (up to upstream.timeout_s) while it starts, unless
        not `wait` (then a child not ready yet is UpstreamUnavailable at once)."""
        if self._aborted or self.state == "closed":
            raise ShuttingDown(self.label, "the sidecar is shutting down")
        if self.state == "starting" and wait:
            try:
                await asyncio.wait_for(self._settled.wait(), self._config.timeout_s)
            except TimeoutError:
                raise UpstreamTimeout(self.label, "the stdio server has not answered its handshake yet") from None
        return self._settled_session()

    def _settled_session(self) -> tuple[StdioChild, UpstreamInfo]:
        if self.state == "ready" and self.child is not None and self.info is not None:
            return self.child, self.info
        if self.state == "closed":
            raise ShuttingDown(self.label, "the sidecar is shutting down")
        raise UpstreamUnavailable(self.label, self.reason or "the stdio server is not running")

    def add_listener(self, listener: NotificationListener) -> Callable[[], None]:
        return self._listeners.add(listener)

    # -- liveness ------------------------------------------------------------------------------------------

    def suspect(self) -> None:
        """A request timed out: probe the child (once at a time); one that does not answer is restarted."""
        if self._probe is None and self.state == "ready":
            self._probe = asyncio.get_running_loop().create_task(self.probe())

    async def probe(self) -> bool:
        """Liveness: True when the ready child answers something cheap within upstream.connect_timeout_s."""
        if self._probe is not None and self._probe is not asyncio.current_task():
            return await asyncio.shield(self._probe)
        try:
            child, info = self.child, self.info
            if self.state != "ready" or child is None or info is None:
                return False
            # ping is gone at 2026-07-28; server/discover is the cheapest request a modern server must answer.
            method, params = ("ping", {}) if info.era == "legacy" else ("server/discover", _DISCOVER_PARAMS)
            within_s = self._config.connect_timeout_s
            try:
                await child.request(method, params, timeout_s=within_s)
            except UpstreamTimeout:
                self._end(child, f"stopped answering (no answer to {method} within {within_s:g} s)", "unresponsive")
                return False
            except UpstreamBusy:
                return True  # our own bound, not the child's silence
            except UpstreamError:
                return child.running
            return True
        finally:
            if self._probe is asyncio.current_task():
                self._probe = None

    def _end(self, child: StdioChild, reason: str, kind: str) -> None:
        if child in self._ending or not child.running:
            return
        logger.warning("ending the stdio server: %s", reason, extra={"upstream": self.label, "pid": child.pid})
        self._ending[child] = (reason, kind)
        self._terminations.spawn(child.terminate(self._config.stop_grace_s))

    # -- one life after another ------------------------------------------------------------------------------

    async def _spawn(self) -> StdioChild:
        config = self._config
        env = child_environment(
            {name: value.get_secret_value() for name, value in config.env.items()}, config.inherit_env
        )
        self._env = env
        child = StdioChild(
            config.command or [],
            # A child started again after one that died before its handshake is likely to say why on stderr: heard.
            stderr_level=logging.WARNING if self._last_exit is not None else logging.INFO,
            env=env,
            cwd=config.cwd,
            label=self.label,
            max_line_bytes=config.max_response_bytes,
            max_in_flight=config.max_in_flight,
            stderr_lines_per_s=config.stderr_lines_per_s,
            metrics=self._metrics,
            on_notification=self._notify,
        )
        await child.spawn()
        self.child = child
        return child

    async def _run(self, child: StdioChild) -> None:
        failures = 0
        while True:
            reason, kind = await self._live(child)
            self._ending.pop(child, None)
            clues = self._early_exit_clues(child) if not self._ready_at and kind == "exited" else {}
            if child.stderr_tail:  # its last words, at warning with the line that says it ended
                clues.setdefault("stderr_tail", child.stderr_tail)
            if self._ready_at and time.monotonic() - self._ready_at >= STABLE_AFTER_S:
                failures = 0
            self._ready_at = 0.0
            while True:
                failures += 1
                self._restarted += 1
                delay_s = self._restarts.delay(failures)
                self._metrics.upstream_restarts.labels(kind).inc()
                ended = f"{reason} at {time.strftime('%H:%M:%SZ', time.gmtime())}"
                so_far = f"{self._restarted} restarts so far"
                self._last_exit = f"it last {ended} ({so_far})"
                self._enter("down", f"the stdio server {ended}; restarting in {delay_s:.1f} s ({so_far})")
                logger.warning("stdio server down", extra={"upstream": self.label, "reason": self.reason, **clues})
                await asyncio.sleep(delay_s)
                try:
                    child = await self._spawn()
                    break
                except StdioStartError as exc:
                    reason, kind, clues = f"could not be started: {exc}", "start_failed", {}

    def _early_exit_clues(self, child: StdioChild) -> dict[str, Any]:
        """Why a child may have exited before its handshake: its last stderr lines, and which variables that let a
        command reach its registry (proxy, CA, index) it did not get."""
        wanted = dict.fromkeys((*REACH_ENVIRONMENT, *self._config.inherit_env))
        return {
            "before_handshake": True,
            "stderr_tail": child.stderr_tail,
            "unset_env": [name for name in wanted if name not in self._env],
            "hint": _ENVIRONMENT_HINT,
        }

    async def _live(self, child: StdioChild) -> tuple[str, str]:
        """Handshake, serve until the child ends; returns why it ended and the restart metric's label."""
        self._enter("starting", _STARTING if self._last_exit is None else f"{_STARTING}; {self._last_exit}")
        try:
            self.info, self.handshake = await self._handshake(child)
        except UpstreamError as exc:
            if not child.running:
                return await child.ended, "exited"
            self._end(child, f"did not complete its handshake ({exc.reason})", "handshake_failed")
        else:
            self._ready_at = time.monotonic()
            self._enter("ready", None)
        ended = await asyncio.shield(child.ended)
        reason, kind = self._ending.get(child, ("", "exited"))
        return (f"{reason}; it {ended}" if reason else ended), kind

    async def _handshake(self, child: StdioChild) -> tuple[UpstreamInfo, JsonObject]:
        timeout_s = self._config.timeout_s
        initialize_first, self._discover_ends_child = self._discover_ends_child, False

        async def discover() -> JsonObject | None:
            if initialize_first:
                return None
            try:
                answer = await child.request("server/discover", own_request_params({}), timeout_s=timeout_s)
            except UpstreamUnavailable:
                # Some servers exit on a method they do not know: the next start goes straight to initialize. Only a
                # child that read the request says so; one that died before reading it (a failed download) says
                # nothing. Where that cannot be told (None), the death counts, as it always did.
                if self._config.protocol == "auto" and child.read_what_it_was_sent() is not False:
                    self._discover_ends_child = True
                    logger.info(
                        "the stdio server ended on server/discover; its next start gets initialize first",
                        extra={"upstream": self.label},
                    )
                raise
            result = answer.get("result")
            return result if isinstance(result, dict) else None

        async def initialize() -> JsonObject:
            answer = await child.request("initialize", INITIALIZE_PARAMS, timeout_s=timeout_s)
            result = initialize_result(self.label, answer)
            child.notify("notifications/initialized")
            return result

        return await learn_era(self.label, self._config.protocol, discover, initialize)

    def _enter(self, state: SupervisorState, reason: str | None) -> None:
        if self.state == "closed":
            return
        self.state = state
        self.reason = reason
        if state == "starting":
            self._settled.clear()
        else:
            self._settled.set()
        if state == "ready":
            self.ever_ready = True
            self._last_exit = None
            if self.child is not None:
                self.child.stderr_level = logging.INFO
            assert self.info is not None
            self._metrics.upstream_speaks(self.info.revision)
            logger.info(
                "stdio server ready", extra={"upstream": self.label, "era": self.info.revision, "pid": self.child_pid}
            )
            self._reach.handshake_answered(self.info)
        else:
            self._reach.not_answering(reason or state, down=state == "down")

    @property
    def child_pid(self) -> int | None:
        return self.child.pid if self.child is not None else None

    def _notify(self, message: JsonObject) -> None:
        for listener in self._listeners:
            try:
                listener(message)
            except Exception:  # boundary: one listener's bug must not keep the message from the others
                logger.exception("a notification listener failed", extra={"method": message.get("method")})
