"""The upstreams of the compatibility suite, each described by what a test needs to drive it the same way.

    async with open_upstream("fastmcp1-eventstore", tmp_path) as up:
        up.url, up.watched_uri, up.stable_uri          # what to watch, what to compare with a direct read
        expected = await up.change_out_of_band(7)     # behind the server's back; the text a re-read must give
        name, args, expected = up.change_by_tool(8)   # the same change made by a tools/call

Upstreams: the npm reference server over streamable HTTP, the FastMCP 1.x notes server with and without an
EventStore, and this repo's SDK 2.3 shop servers (`modern`: dual era; `legacy`: 2025-11-25 only). The
third-party ones skip (a failure under CI) when `.tools/` lacks them.

Every latency a test measures goes into `LATENCIES`; `tests/compat/conftest.py` prints them after the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.peers import start_upstream
from tests.peers.thirdparty import missing, start_everything, start_fastmcp1
from tests.prereqs import skip_missing

__all__ = [
    "IGNORED_FIELDS",
    "LATENCIES",
    "OUT_OF_BAND_POLLING",
    "OUT_OF_BAND_WITHIN_S",
    "POLL_INTERVAL_MS",
    "SLOW_POLLING",
    "SLOW_POLL_MS",
    "THIRD_PARTY",
    "TOOL_CHANGEABLE",
    "TOOL_CHANGE_WITHIN_S",
    "UPSTREAMS",
    "CompatUpstream",
    "comparable",
    "open_upstream",
    "record_latency",
]

UPSTREAMS = ["server-everything", "fastmcp1", "fastmcp1-eventstore", "sdk2-modern", "sdk2-legacy"]
TOOL_CHANGEABLE = [name for name in UPSTREAMS if name != "server-everything"]
"""Upstreams with a tool that changes a resource. server-everything has none: `toggle-subscriber-updates` only
makes it announce updates of content that stays the same, so there is nothing for revalidate-on-write to see."""
THIRD_PARTY = {"server-everything", "fastmcp1", "fastmcp1-eventstore"}
IGNORED_FIELDS = frozenset({"_meta", "ttlMs", "cacheScope", "resultType"})
"""What the sidecar adds or the 2026 era carries; content equal to direct means equal without these."""

POLL_INTERVAL_MS = 1000
"""The poll interval of the out-of-band tests (the SDK 2.3 servers say the same with their ttlMs)."""
OUT_OF_BAND_POLLING = {"default_interval_ms": POLL_INTERVAL_MS, "min_interval_ms": 250}
OUT_OF_BAND_WITHIN_S = 10.0
"""Generous: one poll interval (1 s) plus jitter, a busy machine, and the client's own round trips."""
SLOW_POLL_MS = 600_000
SLOW_POLLING = {"default_interval_ms": SLOW_POLL_MS, "max_interval_ms": SLOW_POLL_MS}
"""For the tool-change tests: a poll comes only every 10 minutes, so a notification at all is revalidate-on-write
(the test waits for the event; how long it took is recorded in the latency report, not asserted)."""
TOOL_CHANGE_WITHIN_S = 30.0
"""How long the tool-change tests wait for the notification: far below the poll interval, far above the
hundreds of milliseconds it takes (the report prints each figure)."""

LATENCIES: list[tuple[str, float]] = []
"""(what was measured, seconds) for every notification the suite waited for, in the order measured."""

EVERYTHING_CLOCK_URI = "demo://resource/dynamic/text/1"
"""server-everything fabricates this text with the time of day (to the second) on every read: it changes by
itself once a second, which is the out-of-band change the suite can observe."""


def record_latency(what: str, seconds: float) -> None:
    """Keep a measured notification latency (and print it, so `pytest -s` shows it as it happens)."""
    LATENCIES.append((what, seconds))
    print(f"latency {what}: {seconds * 1000:.0f} ms")


def comparable(value: Any) -> Any:
    """`value` (a dumped result) without `IGNORED_FIELDS` at any depth."""
    if isinstance(value, dict):
        return {key: comparable(item) for key, item in value.items() if key not in IGNORED_FIELDS}
    if isinstance(value, list):
        return [comparable(item) for item in value]
    return value


ToolChange = tuple[str, dict[str, Any], str]
"""(tool name, arguments, the text the watched resource has afterwards)."""


@dataclass
class CompatUpstream:
    """A running upstream and how to drive it."""

    name: str
    url: str
    watched_uri: str
    """The resource the change tests watch."""
    stable_uri: str
    """A resource whose content does not change, for read-equal-to-direct."""
    tool: tuple[str, dict[str, Any]]
    """A harmless tools/call (no side effect the other tests see)."""
    prompt: tuple[str, dict[str, Any]]
    out_of_band: Callable[[int], Awaitable[str]] | None = None
    """Change the watched resource behind the server's back to variant n; the text a re-read gives after.
    None: it changes by itself (server-everything's clock resource)."""
    by_tool: Callable[[int], ToolChange] | None = None
    """The tools/call that changes the watched resource to variant n. None: no tool changes a resource."""
    era: str = "2025-11-25"
    """The newest protocol version it speaks."""
    restart: Callable[[], Awaitable[None]] | None = None
    """Stop the server and start it again on the same port (a fresh process, which forgets every session);
    None where the suite does not restart it."""

    async def change_out_of_band(self, variant: int) -> str | None:
        """Make the change (None when the resource changes by itself)."""
        return None if self.out_of_band is None else await self.out_of_band(variant)

    def change_by_tool(self, variant: int) -> ToolChange | None:
        return None if self.by_tool is None else self.by_tool(variant)


@contextlib.asynccontextmanager
async def open_upstream(name: str, workdir: Path, *, read_ttl_ms: int = 1000) -> AsyncIterator[CompatUpstream]:
    """Start the upstream called `name` (one of `UPSTREAMS`); `read_ttl_ms` applies to the SDK 2.3 servers,
    the others never say how long a result stays fresh."""
    if name in THIRD_PARTY and (reason := missing()) is not None:
        skip_missing(reason)
    if name == "server-everything":
        async with start_everything(workdir) as server:
            yield CompatUpstream(
                name,
                server.url,
                watched_uri=EVERYTHING_CLOCK_URI,
                stable_uri="demo://resource/static/document/instructions.md",
                tool=("echo", {"message": "compat"}),
                prompt=("args-prompt", {"city": "Lisbon"}),
                restart=server.restart,
            )
    elif name in ("fastmcp1", "fastmcp1-eventstore"):
        notes = workdir / "notes.txt"
        notes.write_text("notes v0", encoding="utf-8")

        async def write_notes(variant: int) -> str:
            text = f"notes v{variant}"
            notes.write_text(text, encoding="utf-8")
            return text

        async with start_fastmcp1(workdir, notes, event_store=name.endswith("eventstore")) as server:
            yield CompatUpstream(
                name,
                server.url,
                watched_uri="notes://current",
                stable_uri="notes://about",
                tool=("echo", {"text": "compat"}),
                prompt=("review_note", {"tone": "dry"}),
                out_of_band=write_notes,
                by_tool=lambda n: ("write_note", {"text": f"notes v{n}"}, f"notes v{n}"),
                restart=server.restart,
            )
    elif name in ("sdk2-modern", "sdk2-legacy"):
        era = "modern" if name == "sdk2-modern" else "legacy"
        async with await start_upstream(era, read_ttl_ms=read_ttl_ms, list_ttl_ms=read_ttl_ms) as shop:

            async def set_price(variant: int) -> str:
                await shop.set_price(1000 + variant)
                return f"price={1000 + variant}"

            yield CompatUpstream(
                name,
                shop.url,
                watched_uri="catalog://price",
                stable_uri="catalog://items/a1",
                tool=("echo", {"text": "compat"}),
                prompt=("pricing", {"sku": "a1"}),
                out_of_band=set_price,
                by_tool=lambda n: ("set_price", {"value": 1000 + n}, f"price={1000 + n}"),
                era="2026-07-28" if era == "modern" else "2025-11-25",
            )
    else:
        raise ValueError(f"unknown upstream {name!r}; one of {UPSTREAMS}")
