"""A FastMCP server on the 1.x Python SDK (2025-11-25 at most): a legacy upstream as people deploy it today.

    .tools/venv-mcp1/bin/python tests/peers/fastmcp1_server.py --port P --notes FILE [--event-store [--retry-ms N]]

Run with the 1.x venv's Python (`bash .ci/install-peers`); it imports nothing from this repository, since the
1.x and 2.x SDKs cannot share an interpreter. Stateful streamable HTTP on 127.0.0.1:P/mcp: `initialize` opens
a session (`Mcp-Session-Id`), POST answers are SSE, a session may open a GET stream.

- `notes://current` (text/plain): the text of FILE, read on every read, so a test can change it behind the
  server's back. `notes://about` never changes. `notes://lines/{n}`: line n (from 1) of FILE.
- tools `write_note(text)` (writes FILE), `echo(text)`, `notify_resources_changed()` (sends
  `notifications/resources/list_changed` on the session's GET stream, so the stream carries an event).
- prompt `review_note(tone)`.
- `GET /health` answers 200 once the server listens.

With `--event-store` the session manager keeps every SSE event in an in-memory EventStore: the server is then
resumable, and each POST's SSE answer opens with a priming event (an `id:` and an empty `data:`; with
`--retry-ms` also a `retry:` field).
FastMCP never registers `resources/subscribe`, so the capabilities say `subscribe: false`.
"""

from __future__ import annotations

import argparse
import itertools
from collections import deque
from pathlib import Path

import uvicorn
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.types import JSONRPCMessage
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

__all__ = ["MemoryEventStore", "build_server", "main"]

NOTES_URI = "notes://current"
ABOUT_URI = "notes://about"
ABOUT_TEXT = "Notes kept in one file; notes://current is its text."
MAX_STORED_EVENTS = 10_000
"""Bound on the event store: a test peer, yet it must not grow without limit in a long run."""


class MemoryEventStore(EventStore):
    """Every event of every stream, in arrival order, with a process-wide counter as the event id.

    Priming events (`message=None`) are stored as cursors: a replay starts after them but never sends them.
    """

    def __init__(self, max_events: int = MAX_STORED_EVENTS) -> None:
        self._events: deque[tuple[EventId, StreamId, JSONRPCMessage | None]] = deque(maxlen=max_events)
        self._ids = itertools.count(1)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        event_id = str(next(self._ids))
        self._events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        events = list(self._events)
        start = next((i for i, (event_id, _, _) in enumerate(events) if event_id == last_event_id), None)
        if start is None:
            return None  # unknown or evicted: nothing to resume
        stream_id = events[start][1]
        for event_id, stream, message in events[start + 1 :]:
            if stream == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id


def build_server(port: int, notes: Path, *, event_store: bool, retry_ms: int | None = None) -> FastMCP:
    """The FastMCP server (not yet running) for `notes`, resumable when `event_store`."""
    mcp = FastMCP(
        "notes-fastmcp1",
        instructions="A notes server on the 1.x SDK, for compatibility tests.",
        host="127.0.0.1",
        port=port,
        event_store=MemoryEventStore() if event_store else None,
        retry_interval=retry_ms,
        log_level="WARNING",
    )

    @mcp.resource(NOTES_URI, name="current", mime_type="text/plain", description="the notes file, as it is now")
    def current() -> str:
        return notes.read_text(encoding="utf-8")

    @mcp.resource(ABOUT_URI, name="about", mime_type="text/plain", description="what this server is")
    def about() -> str:
        return ABOUT_TEXT

    @mcp.resource("notes://lines/{n}", name="line", mime_type="text/plain", description="one line of the notes")
    def line(n: str) -> str:
        lines = notes.read_text(encoding="utf-8").splitlines()
        index = int(n) - 1
        return lines[index] if 0 <= index < len(lines) else ""

    @mcp.tool(description="Replace the notes with `text`.")
    def write_note(text: str) -> str:
        notes.write_text(text, encoding="utf-8")
        return f"wrote {len(text)} characters"

    @mcp.tool(description="Answer with `text`.")
    def echo(text: str) -> str:
        return text

    @mcp.tool(description="Send resources/list_changed on this session's GET stream.")
    async def notify_resources_changed(ctx: Context) -> str:
        # Not tied to this request, so the 1.x transport routes it to the session's standalone GET stream.
        await ctx.session.send_resource_list_changed()
        return "sent"

    @mcp.prompt(description="Ask for a review of the notes in a given tone.")
    def review_note(tone: str) -> str:
        return f"Review the notes in a {tone} tone:\n{notes.read_text(encoding='utf-8')}"

    @mcp.custom_route("/health", methods=["GET"])
    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True, "event_store": event_store})

    return mcp


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--notes", type=Path, required=True, help="the file notes://current reads")
    parser.add_argument("--event-store", action="store_true", help="resumable: SSE answers open with a priming event")
    parser.add_argument("--retry-ms", type=int, help="with --event-store: the priming event's retry field")
    args = parser.parse_args(argv)
    if not args.notes.exists():
        args.notes.write_text("", encoding="utf-8")
    mcp = build_server(args.port, args.notes, event_store=args.event_store, retry_ms=args.retry_ms)
    # A bounded graceful shutdown: an open GET stream would otherwise hold SIGTERM up indefinitely.
    config = uvicorn.Config(
        mcp.streamable_http_app(), host="127.0.0.1", port=args.port, log_level="warning", timeout_graceful_shutdown=1
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
