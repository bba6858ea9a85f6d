"""`GET /status`: what the sidecar is doing right now, as JSON or, for a browser, a small HTML page."""

from __future__ import annotations

import html
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import orjson
from aiohttp import web

from sidecar import __version__
from sidecar.changes import WatchKey
from sidecar.observability.logs import INSTANCE_ID
from sidecar.observability.naming import context_label, shown_uri

__all__ = [
    "MAX_WATCHES_SHOWN",
    "FairShareView",
    "StreamsView",
    "UpstreamView",
    "WatchView",
    "WatchesView",
    "make_status",
    "status_snapshot",
]

MAX_WATCHES_SHOWN = 100
"""The page lists the most-subscribed watches only; totals count them all."""

_STARTED = time.monotonic()


# Narrow, read-only views of what the page reports on: `app.py` hands the real parts in, and this module never
# reaches up into them (observability sits below the upstream, the watch engine and the streams).


class _EraView(Protocol):
    @property
    def revision(self) -> str: ...


class UpstreamView(Protocol):
    """What the page shows of the upstream."""

    @property
    def url(self) -> str: ...

    @property
    def info(self) -> _EraView | None: ...

    @property
    def up(self) -> bool | None: ...

    @property
    def unusable(self) -> str | None: ...

    @property
    def not_ready_reason(self) -> str | None: ...

    @property
    def last_error(self) -> str | None: ...


class WatchView(Protocol):
    """What the page shows of one watch."""

    @property
    def key(self) -> WatchKey: ...

    @property
    def refs(self) -> int: ...

    @property
    def native(self) -> bool: ...

    @property
    def interval_s(self) -> float: ...

    @property
    def last_poll_at(self) -> float | None: ...

    @property
    def last_change_at(self) -> float | None: ...

    @property
    def consecutive_errors(self) -> int: ...


class WatchesView(Protocol):
    """The watches as the page counts them, and the busiest, the only ones it shows (with 100,000 watches, a
    summary of each on every request would hold the event loop for most of a second)."""

    @property
    def watch_count(self) -> int: ...

    @property
    def watched_contexts(self) -> int: ...

    def busiest(self, most: int) -> Iterable[WatchView]:
        """The `most` watches with the most subscribers, those first (ties in the order the watches started)."""
        ...


class StreamsView(Protocol):
    @property
    def stream_count(self) -> int: ...


class FairShareView(Protocol):
    """What the page shows of the upstream's capacity for client requests."""

    capacity: int
    per_client: int
    in_flight: int
    queued: int

    @property
    def active_clients(self) -> int: ...


def _when(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


def status_snapshot(
    upstream: UpstreamView, registry: WatchesView, hub: StreamsView, fair_share: FairShareView | None = None
) -> dict[str, Any]:
    """The status document; an identified context appears only as a short hash, never as a credential."""
    shown = []
    for watch in registry.busiest(MAX_WATCHES_SHOWN):
        key = watch.key
        shown.append(
            {
                "kind": key.kind,
                # An identified context's URI can name a person: only its watch's hash shows (see naming).
                "uri": shown_uri(key.kind, key.uri, key.context),
                "context": context_label(key.context),
                "mode": "native" if watch.native else "polling",
                "interval_ms": int(watch.interval_s * 1000),
                "last_poll": _when(watch.last_poll_at),
                "last_change": _when(watch.last_change_at),
                "consecutive_errors": watch.consecutive_errors,
                "subscribers": watch.refs,
            }
        )
    info = upstream.info
    return {
        "version": __version__,
        "instance": INSTANCE_ID,
        "uptime_s": round(time.monotonic() - _STARTED, 1),
        "ready": upstream.not_ready_reason is None,
        "upstream": {
            "url": upstream.url,
            "era": info.revision if info is not None else None,
            "up": upstream.up,
            "usable": upstream.unusable is None,
            "not_ready_reason": upstream.not_ready_reason,
            "last_error": upstream.last_error,
        },
        "counts": {
            "streams": hub.stream_count,
            "watches": registry.watch_count,
            "contexts": registry.watched_contexts,
        },
        "watches": shown,
        "watches_shown": len(shown),
        "fair_share": None
        if fair_share is None
        else {
            "capacity": fair_share.capacity,
            "per_client": fair_share.per_client,
            "in_flight": fair_share.in_flight,
            "queued": fair_share.queued,
            "active_clients": fair_share.active_clients,
        },
    }


def _render_html(status: dict[str, Any]) -> str:
    def cell(value: Any) -> str:
        return f"<td>{html.escape('' if value is None else str(value))}</td>"

    columns = [
        "kind",
        "uri",
        "context",
        "mode",
        "interval_ms",
        "last_poll",
        "last_change",
        "consecutive_errors",
        "subscribers",
    ]
    rows = "".join("<tr>" + "".join(cell(watch[c]) for c in columns) + "</tr>" for watch in status["watches"])
    upstream = status["upstream"]
    counts = status["counts"]
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>mcp-sidecar status</title>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:left}</style></head><body>"
        f"<h1>mcp-sidecar {html.escape(status['version'])}</h1>"
        f"<p>instance {html.escape(status['instance'])}, up {status['uptime_s']} s, "
        f"ready: {'yes' if status['ready'] else 'no'}</p>"
        f"<p>upstream {html.escape(upstream['url'])} (era {html.escape(str(upstream['era']))})"
        f"{' — ' + html.escape(upstream['not_ready_reason']) if upstream['not_ready_reason'] else ''}</p>"
        f"<p>{counts['streams']} streams, {counts['watches']} watches, {counts['contexts']} contexts "
        f"(showing {status['watches_shown']})</p>"
        + (
            f"<p>upstream requests: {share['in_flight']} of {share['capacity']} in flight, {share['queued']} waiting, "
            f"{share['active_clients']} clients</p>"
            if (share := status["fair_share"]) is not None
            else ""
        )
        + "<table><tr>"
        + "".join(f"<th>{c}</th>" for c in columns)
        + f"</tr>{rows}</table></body></html>"
    )


def make_status(
    upstream: UpstreamView, registry: WatchesView, hub: StreamsView, fair_share: FairShareView | None = None
) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def status(request: web.Request) -> web.Response:
        snapshot = status_snapshot(upstream, registry, hub, fair_share)
        if "text/html" in request.headers.get("Accept", ""):
            return web.Response(text=_render_html(snapshot), content_type="text/html")
        return web.Response(body=orjson.dumps(snapshot), content_type="application/json")

    return status
