"""Whether an upstream's 4xx answer to a request on one of the sidecar's sessions means "I do not know this
session" (it was restarted, or expired the session), so that the sidecar opens a new one and asks again.

The transport spec says 404. Real servers differ: `@modelcontextprotocol/server-everything` answers a session it
forgot (after a restart) with 400 and a JSON-RPC error "Bad Request: No valid session ID provided"; the 1.x Python
SDK answers 404. So a refusal is any of: a 404; a 4xx whose answer speaks of the session as unknown, missing,
invalid, expired or not found; or any 4xx to a session the upstream may have forgotten (`suspect`: opened before
an outage and not answered since). A refused credential (401, 403) and a busy or slow upstream (408, 429) never
are: those say nothing about the session, and a new session would not change them.
"""

from __future__ import annotations

import orjson

__all__ = ["refuses_session"]

_NOT_ABOUT_THE_SESSION = frozenset({401, 403, 408, 429})
_GONE_WORDS = ("unknown", "missing", "invalid", "not found", "no valid", "expired", "terminated", "does not exist")
_READ_BYTES = 4096
"""How much of an answer is looked at for its words: a refusal says so in a line."""


def refuses_session(status: int, body: bytes, *, suspect: bool) -> bool:
    """The upstream's answer (`status`, `body`) to a request carrying one of the sidecar's session ids says it no
    longer knows that session; `suspect`: the session predates the upstream's last outage."""
    if status == 404:
        return True
    if not 400 <= status < 500 or status in _NOT_ABOUT_THE_SESSION:
        return False
    if suspect:
        return True
    text = _said(body).lower()
    return "session" in text and any(word in text for word in _GONE_WORDS)


def _said(body: bytes) -> str:
    """What the answer says: a JSON-RPC error's message (and its data, when that is text), else the body's text."""
    head = body[:_READ_BYTES]
    try:
        message = orjson.loads(body) if len(body) <= _READ_BYTES else None
    except orjson.JSONDecodeError:
        message = None
    if isinstance(message, dict) and isinstance(error := message.get("error"), dict):
        parts = [error.get("message"), error.get("data")]
        return " ".join(part for part in parts if isinstance(part, str))
    return head.decode("utf-8", errors="replace")
