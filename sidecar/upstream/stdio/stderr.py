"""A stdio server's stderr, read as it comes (a pipe nobody reads fills up and blocks the child): each line masked,
logged rate-limited under the logger `sidecar.upstream.stdio.stderr`, and the last ones kept to say why it ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from sidecar.masking import scrub
from sidecar.observability.metrics import Metrics
from sidecar.upstream.stdio.lines import LineSplitter, OverlongLine, RateLimitedLog, TokenBucket

__all__ = ["StderrReader", "stderr_logger"]

stderr_logger = logging.getLogger("sidecar.upstream.stdio.stderr")  # a documented name: users route it
"""The child's own stderr lines, one log record each, so they can be routed or silenced apart."""

_READ_CHUNK_BYTES = 65_536
_STDERR_LINE_BYTES = 8_192
"""A longer stderr line is logged cut to this length."""
_STDERR_TAIL_LINES = 10
_STDERR_TAIL_LINE_CHARS = 200
"""The last stderr lines kept to say why a child ended (10 of at most 200 characters)."""


class StderrReader:
    """One child's stderr: its lines logged within `lines_per_s`, its last ones kept."""

    def __init__(self, lines_per_s: float, metrics: Metrics) -> None:
        self._lines_per_s = lines_per_s
        self._metrics = metrics
        self._tail: deque[str] = deque(maxlen=_STDERR_TAIL_LINES)

    @property
    def tail(self) -> list[str]:
        """The last lines the child wrote on stderr (at most 10, each cut to 200 characters)."""
        return list(self._tail)

    async def drain(
        self, stream: asyncio.StreamReader, *, level: Callable[[], int], exited: Callable[[], bool], extra: Any
    ) -> None:
        """Until the pipe closes. A line written once the child has exited says why it ended: a warning."""
        lines = LineSplitter(_STDERR_LINE_BYTES)
        log = RateLimitedLog(stderr_logger, "stdio server stderr lines not logged (over upstream.stderr_lines_per_s)")
        allowance = TokenBucket(self._lines_per_s)
        logged = self._metrics.upstream_stderr_lines.labels("logged")
        dropped = self._metrics.upstream_stderr_lines.labels("dropped")
        with contextlib.suppress(Exception):  # boundary: a failing drain must not take the child down with it
            while chunk := await stream.read(_READ_CHUNK_BYTES):
                for line in lines.feed(chunk):
                    text = (line.head if isinstance(line, OverlongLine) else line).decode("utf-8", "replace").rstrip()
                    text = scrub(text)  # a child may print its own arguments: a reason built from it shows no secret
                    if not text:
                        continue
                    self._tail.append(text[:_STDERR_TAIL_LINE_CHARS])
                    if allowance.take():
                        log.flush()
                        stderr_logger.log(logging.WARNING if exited() else level(), "%s", text, extra=extra)
                        logged.inc()
                    else:
                        log.count()
                        dropped.inc()
            log.flush()
