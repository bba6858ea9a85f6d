"""One stdio MCP server process: newline-delimited JSON-RPC on its stdin and stdout, requests multiplexed by id.

The child runs in a process group of its own (`process.py`), so `terminate` reaches whatever it started,
through wrapper chains too (npx, uvx, `sh -c`): SIGTERM to the whole group, SIGKILL after the grace. Its
stderr is read as it comes (a pipe nobody reads fills up and blocks the child) and logged, rate-limited,
under the logger `sidecar.upstream.stdio.stderr`. Each request goes out with an id of ours, and a progress
token of ours when it carries one, so callers that picked the same ids never meet; a notification tied to a
request in flight (its progress, or a frame of the listen stream it opened) goes to that request, any other
to `on_notification`. The child's own requests are answered as over HTTP (`era.reply_to_server_request`).
One `StdioChild` is one life of the process; restarting it is `supervisor.py`'s job.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from sidecar.observability.metrics import Metrics
from sidecar.protocol import (
    META_SUBSCRIPTION_ID,
    JsonObject,
    UpstreamBadResponse,
    UpstreamBusy,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from sidecar.upstream.era import reply_to_server_request
from sidecar.upstream.stdio.lines import LineSplitter, OverlongLine, RateLimitedLog
from sidecar.upstream.stdio.process import ChildStdin, end_process_group, exit_reason, start_in_own_session
from sidecar.upstream.stdio.stderr import StderrReader

__all__ = ["InFlight", "StdioChild"]

logger = logging.getLogger(__name__)

NotificationSink = Callable[[JsonObject], None]

_READ_CHUNK_BYTES = 65_536
_STDERR_SETTLE_S = 0.5
"""How long an exited child's last stderr lines may take to be read, when something else still holds the pipe."""
_EXIT_AFTER_EOF_S = 2.0
"""A child that closed its stdout has this long to exit on its own before its group is ended."""
_CANCELLED_CODE = -32603  # nobody reads it: the client that cancelled expects no answer


@dataclass(eq=False, slots=True)
class InFlight:
    """One request waiting on the child: its id there, and where its own notifications go."""

    id: int
    method: str
    answer: asyncio.Future[JsonObject]
    on_notification: NotificationSink | None
    progress_token: Any = None
    """The caller's own progress token (progress notifications go back with it)."""


class StdioChild:
    """One life of the child process and its pipes."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        label: str,
        max_line_bytes: int,
        max_in_flight: int,
        stderr_lines_per_s: float,
        metrics: Metrics,
        on_notification: NotificationSink,
        stderr_level: int = logging.INFO,
    ) -> None:
        self.label = label
        """How errors name the upstream (`stdio: <command>`)."""
        self._command = list(command)
        self._env = dict(env)
        self._cwd = cwd
        self._max_line_bytes = max_line_bytes
        self._max_in_flight = max_in_flight
        self.stderr_level = stderr_level
        """The level of its stderr lines while it runs; once it has exited, its last ones are warnings."""
        self._metrics = metrics
        self._on_notification = on_notification
        self._proc: asyncio.subprocess.Process | None = None
        self._stdin: ChildStdin | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, InFlight] = {}
        self._by_token: dict[str, InFlight] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stderr = StderrReader(stderr_lines_per_s, metrics)
        self._bad_lines = RateLimitedLog(logger, "stdio server wrote lines that are not JSON-RPC (ignored)")
        self.ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        """Resolves, with the reason in words, once the process is gone and its stdout closed."""
        self.started_at = 0.0
        self.last_heard_at = 0.0
        """When the child last wrote a JSON-RPC message (monotonic clock)."""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def running(self) -> bool:
        return self._proc is not None and not self.ended.done()

    @property
    def stderr_tail(self) -> list[str]:
        """The last lines the child wrote on stderr (at most 10, each cut to 200 characters)."""
        return self._stderr.tail

    def read_what_it_was_sent(self) -> bool | None:
        """Once the child has ended: True when it had read every byte written to it, False when it had not (or
        nothing was written), None when that cannot be told (not Linux)."""
        return self._stdin.read_it_all() if self._stdin is not None else False

    async def spawn(self) -> None:
        """Start the process in a session (and process group) of its own; StdioStartError if it cannot start."""
        self._proc, self._stdin = await start_in_own_session(self._command, self._env, self._cwd)
        self.started_at = time.monotonic()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._read_stdout()), loop.create_task(self._drain_stderr())]
        logger.info("stdio server started", extra={"upstream": self.label, "pid": self._proc.pid})

    # -- requests ------------------------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        params: JsonObject,
        *,
        timeout_s: float,
        on_sent: Callable[[InFlight], None] | None = None,
    ) -> JsonObject:
        """Send a request and wait for its answer (a JSON-RPC response with `result` or `error`); `on_sent` learns
        the call as soon as it is written (to cancel it later by its id here)."""
        try:
            async with asyncio.timeout(timeout_s):
                call = await self.send(method, params)
                if on_sent is not None:
                    on_sent(call)
                return await self.wait(call)
        except TimeoutError:
            raise UpstreamTimeout(self.label, "no answer in time") from None

    async def send(
        self, method: str, params: JsonObject, *, on_notification: NotificationSink | None = None
    ) -> InFlight:
        """Write a request; the returned call is answered by `wait` (or dropped by `forget`)."""
        if not self.running:
            raise UpstreamUnavailable(self.label, "the stdio server is not running")
        if len(self._pending) >= self._max_in_flight:
            self._metrics.limit_rejections.labels("upstream_max_in_flight").inc()
            raise UpstreamBusy(self.label, f"{self._max_in_flight} requests already in flight (upstream.max_in_flight)")
        call = InFlight(next(self._ids), method, asyncio.get_running_loop().create_future(), on_notification)
        meta = params.get("_meta")
        if isinstance(meta, dict) and "progressToken" in meta:
            # Two clients may both pick token 1: the child sees ours, the caller gets its own back.
            call.progress_token = meta["progressToken"]
            token = f"sidecar-progress-{call.id}"
            self._by_token[token] = call
            params = {**params, "_meta": {**meta, "progressToken": token}}
        self._pending[call.id] = call
        try:
            await self._write({"jsonrpc": "2.0", "id": call.id, "method": method, "params": params})
        except BaseException:
            self._drop(call)
            raise
        return call

    async def wait(self, call: InFlight) -> JsonObject:
        """The answer to `call`; a caller that gives up (cancelled, timed out) tells the child to stop."""
        try:
            return await call.answer
        except asyncio.CancelledError:  # the caller left, or its deadline passed
            self.cancel(call, "the request was abandoned")
            raise
        finally:
            self._drop(call)

    def cancel(self, call: InFlight, reason: str) -> None:
        """Stop waiting for `call` and ask the child to cancel it (`notifications/cancelled`). A caller still
        waiting gets an error answer now: the child should not answer a cancelled request at all."""
        if self._pending.get(call.id) is call:
            self._drop(call)
            self.notify("notifications/cancelled", {"requestId": call.id, "reason": reason})
            if not call.answer.done():
                error = {"code": _CANCELLED_CODE, "message": f"request cancelled: {reason}"}
                call.answer.set_result({"jsonrpc": "2.0", "id": call.id, "error": error})

    def notify(self, method: str, params: JsonObject | None = None) -> None:
        """Write a notification without waiting for the pipe (it is small; a full pipe holds it in memory)."""
        params_part: JsonObject = {} if params is None else {"params": params}
        self._write_nowait({"jsonrpc": "2.0", "method": method, **params_part})

    def _drop(self, call: InFlight) -> None:
        if self._pending.get(call.id) is call:
            del self._pending[call.id]
        for token, holder in list(self._by_token.items()):
            if holder is call:
                del self._by_token[token]

    async def _write(self, message: JsonObject) -> None:
        if self._stdin is None:
            raise UpstreamUnavailable(self.label, "the stdio server is not running")
        if self._stdin.writer.is_closing():
            # A child that exited at once: writing to its closed pipe would raise RuntimeError under uvloop.
            raise UpstreamUnavailable(self.label, "the stdio server closed its stdin")
        try:
            await self._stdin.write(orjson.dumps(message) + b"\n")
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise UpstreamUnavailable(self.label, "the stdio server closed its stdin") from exc

    def _write_nowait(self, message: JsonObject) -> None:
        stdin = self._stdin.writer if self._stdin is not None else None
        if stdin is None or stdin.is_closing() or not self.running:
            return
        with contextlib.suppress(OSError):
            stdin.write(orjson.dumps(message) + b"\n")

    def fail_all(self, error: UpstreamError) -> None:
        """Every request in flight fails with `error` (the child is gone, or shutdown cut it short)."""
        for call in list(self._pending.values()):
            self._drop(call)
            if not call.answer.done():
                call.answer.set_exception(error)
                call.answer.exception()  # retrieved here too: a caller that left meanwhile leaves no warning

    # -- the child's output --------------------------------------------------------------------------------

    async def _read_stdout(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        lines = LineSplitter(self._max_line_bytes)
        try:
            while chunk := await self._proc.stdout.read(_READ_CHUNK_BYTES):
                for line in lines.feed(chunk):
                    self._dispatch_line(line)
        except Exception:  # boundary: a bug here must still end this life cleanly, so the child is restarted
            logger.exception("reading the stdio server's output failed", extra={"upstream": self.label})
        await self._finish()

    def _dispatch_line(self, line: bytes | OverlongLine) -> None:
        if isinstance(line, OverlongLine):
            self._overlong(line)
            return
        line = line.strip()
        if not line:
            return
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError:
            message = None
        for item in message if isinstance(message, list) else [message]:  # a batch, from an older server
            if isinstance(item, dict) and item.get("jsonrpc") == "2.0":
                self._dispatch(item)
            else:
                self._metrics.upstream_bad_lines.inc()
                self._bad_lines.log(line[:200].decode("utf-8", "replace"))

    def _dispatch(self, message: JsonObject) -> None:
        self.last_heard_at = time.monotonic()
        method = message.get("method")
        if isinstance(method, str):
            if "id" in message:
                self._answer_server_request(message)
            else:
                self._route_notification(method, message)
            return
        answer_id = message.get("id")
        call = self._pending.get(answer_id) if type(answer_id) is int else None  # True == 1, but is no id of ours
        if call is None or not ("result" in message or "error" in message):
            logger.debug("stdio answer to no request in flight", extra={"upstream": self.label})
            return
        self._drop(call)
        if not call.answer.done():
            call.answer.set_result(message)

    def _answer_server_request(self, request: JsonObject) -> None:
        reply = reply_to_server_request(request)
        if "error" in reply:
            logger.info("refused a request from the stdio server", extra={"method": request["method"]})
        self._write_nowait(reply)

    def _route_notification(self, method: str, message: JsonObject) -> None:
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        call: InFlight | None = None
        if method == "notifications/progress":
            token = params.get("progressToken")
            call = self._by_token.get(token) if isinstance(token, str) else None
            if call is None:
                return  # progress of a request no longer in flight: nobody asked for it any more
            message = {**message, "params": {**params, "progressToken": call.progress_token}}
        else:
            meta = params.get("_meta")
            subscription = meta.get(META_SUBSCRIPTION_ID) if isinstance(meta, dict) else None
            call = self._pending.get(subscription) if type(subscription) is int else None
        if call is None:
            sink = self._on_notification
        elif call.on_notification is not None:
            sink = call.on_notification
        else:
            return  # tied to a request that did not ask for its notifications
        try:
            sink(message)
        except Exception:  # boundary: a listener's bug must not stop the reader every request depends on
            logger.exception("a notification listener failed", extra={"method": method})

    def _overlong(self, line: OverlongLine) -> None:
        self._metrics.limit_rejections.labels("upstream_max_response_bytes").inc()
        answer_id = line.find_id()
        call = self._pending.get(answer_id) if answer_id is not None else None
        logger.warning(
            "stdio server wrote a line larger than upstream.max_response_bytes (dropped)",
            extra={"upstream": self.label, "bytes": line.size, "limit": self._max_line_bytes},
        )
        if call is not None:
            self._drop(call)
            if not call.answer.done():
                error = UpstreamBadResponse(self.label, f"response larger than {self._max_line_bytes} bytes")
                call.answer.set_exception(error)

    async def _drain_stderr(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stderr is not None
        extra = {"upstream": self.label, "pid": self.pid, "source": "stderr"}
        await self._stderr.drain(
            proc.stderr, level=lambda: self.stderr_level, exited=lambda: proc.returncode is not None, extra=extra
        )

    async def _finish(self) -> None:
        """stdout is closed: the child exits (or is made to), every request in flight fails, `ended` resolves."""
        assert self._proc is not None and self._stdin is not None
        try:
            await asyncio.wait_for(self._proc.wait(), _EXIT_AFTER_EOF_S)
            reason = exit_reason(self._proc.returncode)
        except TimeoutError:
            reason = "closed its stdout"
            await self.terminate(_EXIT_AFTER_EOF_S, wait_for_end=False)
        self._stdin.close()
        # Its last words may still be in the stderr pipe: read them, unless a process that lives on holds it.
        await asyncio.wait(self._tasks[1:], timeout=_STDERR_SETTLE_S)
        if tail := self._stderr.tail:
            reason += f" (last stderr line: {tail[-1]})"
        self.fail_all(UpstreamUnavailable(self.label, f"the stdio server {reason}"))
        if not self.ended.done():
            self.ended.set_result(reason)

    # -- the end -------------------------------------------------------------------------------------------

    async def terminate(self, grace_s: float, *, wait_for_end: bool = True) -> None:
        """SIGTERM to the whole process group, SIGKILL to it after `grace_s`; returns once the group is gone."""
        proc = self._proc
        if proc is None or self._stdin is None:
            return
        self._stdin.close()  # many servers end on end of input alone
        await end_process_group(proc, grace_s, self.label)
        if wait_for_end:
            await asyncio.shield(self.ended)
            # A process that left the group (a daemon of its own session) may hold stderr open: do not wait on it.
            _, pending = await asyncio.wait(self._tasks, timeout=grace_s)
            for task in pending:
                task.cancel()
