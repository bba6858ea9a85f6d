"""What the fault-injecting upstream (`tests.peers.faulty`) can do to a request, which requests a fault hits,
and what it records of each message that reached it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

__all__ = ["HTML_BODY", "Fault", "Rule", "Seen"]

HTML_BODY = (
    b"<html><body><h1>Internal Server Error</h1><pre>Traceback (most recent call last):\n"
    b'  File "/srv/app/secret_internals.py", line 42, in handler\n'
    b"    db.connect(password='hunter2')\nConnectionError: database on 10.0.0.7 is down</pre></body></html>"
)
"""What an HTML error page of a crashing upstream shows: none of it may reach a client."""


class Fault(enum.Enum):
    RESET_MID_BODY = "reset-mid-body"
    """Headers promising 4096 bytes of JSON, 100 of them, then a TCP reset."""
    HANG = "hang"
    """The request is read and never answered (until the upstream stops)."""
    HTML_500 = "html-500"
    HTML_502 = "html-502"
    NOT_JSON = "not-json"
    """200 with ``Content-Type: application/json`` and an HTML body."""
    TRUNCATED_SSE = "truncated-sse"
    """200 ``text/event-stream`` (chunked): a progress event, half of the next event, then the connection closes."""
    OVERSIZED_JSON = "oversized-json"
    """200 with a well-formed JSON-RPC answer of ``oversize_bytes``, chunked (no Content-Length to refuse early)."""
    OVERSIZED_SSE = "oversized-sse"
    """The same answer as one SSE event."""
    DRIP = "drip"
    """200 with a whole, valid answer's Content-Length, its body sent one byte every 0.1 s (a slow-loris upstream)."""
    CLOSED_WHEN_REUSED = "closed-when-reused"
    """On a connection that already served a request: read the request, close without a byte (a server's idle
    timeout crossing the next request on a kept-alive connection). The first request on a connection is served."""
    SESSION_404 = "session-404"
    """Legacy era: every request on a session is answered 404, as if the upstream forgot the session at once."""


@dataclass(frozen=True)
class Rule:
    """Which requests a fault hits: all of `methods` (default: reads) whose URI and token match, when given."""

    fault: Fault
    uri: str | None = None
    token: str | None = None
    methods: frozenset[str] | None = frozenset({"resources/read"})

    def matches(self, method: str | None, uri: str | None, token: str | None) -> bool:
        return (
            (self.methods is None or method in self.methods)
            and (self.uri is None or uri == self.uri)
            and (self.token is None or token == self.token)
        )


@dataclass
class Seen:
    """One JSON-RPC message that reached the upstream."""

    method: str | None
    id: Any
    uri: str | None
    authorization: str | None
    session: str | None
    arrived: float
    """Loop time when the whole request had arrived."""
    fault: Fault | None = None
    done: float | None = None
    """Loop time when the answer was written (None: never answered)."""

    @property
    def by_sidecar(self) -> bool:
        """A request the sidecar made on its own (poll, baseline, probe): its ids are ``sidecar-N``."""
        return isinstance(self.id, str) and self.id.startswith("sidecar-")
