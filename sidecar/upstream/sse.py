"""Server-sent events as the WHATWG HTML standard defines them, read from the upstream and framed for clients.

Resumable servers (the npm reference server, 1.x Python SDK servers with an EventStore) open every SSE
answer with a *priming event*: an `id:` and an empty `data:`. Such events, and any without data, are
not messages and are skipped, as the standard says. Comments (`:` lines) are keep-alives; `id:` and
`retry:` serve a resumption the sidecar does not offer to its clients (2026-07-28 removed it), so
`frame` writes only the event type and its data. Lines may end in CR, LF or CRLF, also split across
chunks. A small decoder of our own: the maintained PyPI SSE clients own the HTTP request and
reconnection, while the sidecar needs to decode a response it already holds and relay events whole.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SSEDecoder", "SSEEvent", "SSETooLarge", "frame"]

SSE_CONTENT_TYPE = "text/event-stream"
_BOM = "\ufeff"


class SSETooLarge(ValueError):
    """An event (or a line without its end) grew past the decoder's limit."""


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event: its type (`message` unless named), its data, and the last event id."""

    data: str
    event: str = "message"
    id: str | None = None
    retry_ms: int | None = None


class SSEDecoder:
    """Incremental decoder: `feed` bytes as they arrive, get the events they complete. At the end of the
    stream an event not closed by a blank line is discarded (the standard's rule).

    `limit` bounds the bytes of one event still being read (its data and any unfinished line), so a
    peer that never ends a line or an event cannot grow memory without bound.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._pending = bytearray()
        self._skip_lf = False  # the last chunk ended in CR: a LF starting the next one belongs to it
        self._first_line = True
        self._data: list[str] = []
        self._data_size = 0
        self._event = ""
        self._last_id: str | None = None
        self._retry_ms: int | None = None

    @property
    def pending_bytes(self) -> int:
        """Bytes of the event not yet dispatched (for the caller's own accounting)."""
        return len(self._pending) + self._data_size

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        buffer = self._pending
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        start = len(buffer)
        buffer += chunk
        position = 0
        while True:
            cr = buffer.find(b"\r", max(start, position))
            lf = buffer.find(b"\n", max(start, position))
            if cr < 0 and lf < 0:
                break
            end = lf if cr < 0 else cr if lf < 0 else min(cr, lf)
            line = bytes(buffer[position:end])
            if buffer[end : end + 1] == b"\r":
                if end + 1 == len(buffer):
                    self._skip_lf = True
                    position = end + 1
                elif buffer[end + 1 : end + 2] == b"\n":
                    position = end + 2
                else:
                    position = end + 1
            else:
                position = end + 1
            start = position
            event = self._line(line.decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
        del buffer[:position]
        if self.pending_bytes > self._limit:
            raise SSETooLarge(f"SSE event larger than {self._limit} bytes")
        return events

    def _line(self, line: str) -> SSEEvent | None:
        if self._first_line:
            self._first_line = False
            line = line.removeprefix(_BOM)
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment: keep-alive
        field, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
            self._data_size += len(value) + 1
        elif field == "event":
            self._event = value
        elif field == "id":
            if "\0" not in value:
                self._last_id = value
        elif field == "retry":
            if value.isascii() and value.isdigit():
                self._retry_ms = int(value)
        return None  # unknown fields are ignored

    def _dispatch(self) -> SSEEvent | None:
        data, event = self._data, self._event
        self._data, self._data_size, self._event = [], 0, ""
        text = "\n".join(data)
        if not text.strip():
            # No data, or only blank data lines (a priming event, a lone id or retry). The standard still fires
            # an event with empty data; no JSON-RPC message is empty, so there is nothing to deliver.
            return None
        return SSEEvent(text, event or "message", self._last_id, self._retry_ms)


def frame(event: SSEEvent) -> bytes:
    """The event as the sidecar writes it to a client: its type and data only (no id, no retry)."""
    lines = "".join(f"data: {line}\r\n" for line in event.data.split("\n"))
    return f"event: {event.event}\r\n{lines}\r\n".encode()
