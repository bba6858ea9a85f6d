"""`StdioUpstream`: the era bridge over a stdio child process, what `app.py` builds when `upstream.command` is set."""

from __future__ import annotations

from collections.abc import Callable

from sidecar.config import CacheConfig, UpstreamConfig
from sidecar.observability.metrics import Metrics
from sidecar.upstream.base import NotificationListener
from sidecar.upstream.bridge import UpstreamBridge
from sidecar.upstream.reachability import Reachability
from sidecar.upstream.stdio.transport import StdioTransport

__all__ = ["StdioUpstream"]


class StdioUpstream(UpstreamBridge):
    """An MCP server the sidecar starts as a child process; its supervisor tells whether it is reachable."""

    def __init__(self, config: UpstreamConfig, cache: CacheConfig, metrics: Metrics | None = None) -> None:
        metrics = metrics or Metrics()
        reachability = Reachability(config.display_url, metrics)  # the supervisor tells it
        self._stdio = StdioTransport(config, metrics, reachability)
        super().__init__(self._stdio, reachability, cache)

    @property
    def pid(self) -> int | None:
        return self._stdio.pid  # see StdioTransport

    def add_notification_listener(self, listener: NotificationListener) -> Callable[[], None]:
        return self._stdio.add_notification_listener(listener)  # a `NotificationSource`: see StdioTransport
