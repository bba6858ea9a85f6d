"""What the log says while an HTTP upstream is unreachable, and when the sidecar asks it again.

An outage is logged once as it begins ("upstream unreachable", with the reason), then at a backed-off pace while
it lasts ("upstream still unreachable": 1 s, 2 s, 4 s ... up to a minute apart), and ends with "upstream reachable
again" only when an exchange with the upstream succeeded. The same schedule paces the sidecar's own retries, so
each "still unreachable" line reports a retry that failed, and recovery is noticed without a client or a
readiness probe asking.
"""

from __future__ import annotations

import logging
import time

from sidecar.backoff import Backoff

__all__ = ["RETRY_INITIAL_S", "RETRY_MAX_S", "Outage"]

logger = logging.getLogger("sidecar.upstream")

RETRY_INITIAL_S = 1.0
RETRY_MAX_S = 60.0
_PACE = Backoff(RETRY_INITIAL_S, RETRY_MAX_S)
"""No jitter: the pace of one process's own retries and log lines, which nothing else shares."""


class Outage:
    """One upstream's reachability as the log tells it, and the retry pace while it is down."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._since: float | None = None
        """When the outage began (monotonic), None while the upstream is not known to be down."""
        self._lines = 1
        """The lines this outage has logged (or would have): the pace doubles with each."""
        self._next_line_at = 0.0
        self.ever_reached = False
        """The upstream has answered once: a later answer after an outage is "reachable again"."""

    @property
    def retry_in_s(self) -> float:
        """How long until the next retry (and the next "still unreachable" line) of this outage."""
        return _PACE.delay(self._lines)

    def failed(self, reason: str) -> None:
        """A transport failure: the first of an outage is logged (unless the upstream was never reached: the
        start-up line says so); later ones only once the backed-off pause since the last line has passed."""
        now = time.monotonic()
        extra = {"upstream": self._url, "reason": reason}
        if self._since is None:
            self._since = now
            self._lines = 1
            self._next_line_at = now + self.retry_in_s
            if self.ever_reached:
                logger.warning("upstream unreachable", extra={**extra, "retry_in_s": self.retry_in_s})
            return
        if now < self._next_line_at:
            return
        self._lines += 1
        self._next_line_at = now + self.retry_in_s
        down_s = round(now - self._since, 1)
        logger.warning("upstream still unreachable", extra={**extra, "down_s": down_s, "retry_in_s": self.retry_in_s})

    def answered(self) -> bool:
        """An exchange with the upstream succeeded; True when that ends an outage."""
        reached_before, self.ever_reached = self.ever_reached, True
        if self._since is None:
            return False
        down_s = round(time.monotonic() - self._since, 1)
        self._since = None
        if reached_before:
            logger.info("upstream reachable again", extra={"upstream": self._url, "down_s": down_s})
        return True
