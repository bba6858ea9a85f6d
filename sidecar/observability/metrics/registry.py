"""`Metrics`: every metric family of one sidecar, in its own registry, and the exposition a scraper asks for."""

from __future__ import annotations

import platform

import aiohttp
from prometheus_client import CollectorRegistry, Gauge, disable_created_metrics
from prometheus_client.exposition import CONTENT_TYPE_LATEST, choose_encoder

from sidecar import __version__
from sidecar.observability.metrics.bus import BusMetrics
from sidecar.observability.metrics.cache import CacheMetrics
from sidecar.observability.metrics.delivery import DeliveryMetrics
from sidecar.observability.metrics.limits import LimitMetrics
from sidecar.observability.metrics.polls import PollMetrics
from sidecar.observability.metrics.requests import RequestMetrics
from sidecar.observability.metrics.stdio import StdioMetrics
from sidecar.observability.metrics.streams import StreamMetrics, StreamUpkeepMetrics
from sidecar.observability.metrics.upstream import UpstreamMetrics
from sidecar.observability.metrics.watches import WatchMetrics

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

# No `_created` series beside every counter and histogram: Prometheus does not use them (it infers resets), and
# they double the series an operator scrapes and stores. Process-wide, as prometheus_client keeps the switch.
disable_created_metrics()  # type: ignore[no-untyped-call]


class Metrics(
    RequestMetrics,
    UpstreamMetrics,
    StreamMetrics,
    WatchMetrics,
    PollMetrics,
    DeliveryMetrics,
    LimitMetrics,
    StreamUpkeepMetrics,
    CacheMetrics,
    BusMetrics,
    StdioMetrics,
):
    """Every metric family of one sidecar, in its own registry (tests build several apps in one process).

    Each base defines the families of one area as attributes of this one object, so a caller holds one `Metrics`
    and names any family on it. Series of the known label values exist from the start, at 0: a ratio or
    `increase()` then sees the first error, rejection or change instead of a series that appears already at 1.
    """

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        # The order the families are registered in is the order `/metrics` lists them, and the README's table.
        RequestMetrics.__init__(self, r)
        UpstreamMetrics.__init__(self, r)
        StreamMetrics.__init__(self, r)
        WatchMetrics.__init__(self, r)
        PollMetrics.__init__(self, r)
        DeliveryMetrics.__init__(self, r)
        LimitMetrics.__init__(self, r)
        StreamUpkeepMetrics.__init__(self, r)
        CacheMetrics.__init__(self, r)
        BusMetrics.__init__(self, r)
        StdioMetrics.__init__(self, r)
        build = Gauge(
            "mcp_sidecar_build_info",
            "Versions of the sidecar, Python and aiohttp, in the labels; always 1",
            ["version", "python", "aiohttp"],
            registry=r,
        )
        build.labels(__version__, platform.python_version(), aiohttp.__version__).set(1)

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition and its content type: OpenMetrics (with the exemplars that carry trace ids) when
        `accept` (the scraper's Accept header) asks for it, Prometheus text otherwise."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
