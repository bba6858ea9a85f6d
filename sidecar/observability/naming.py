"""How the status page and the logs name a context and a URI: in plain where no person is behind it, hashed
where one may be.

The anonymous context is everyone without credentials: its URIs name nobody, so they show as they are. An
identified context's URI can name a person ("user://alice/diagnosis.pdf"): it shows only as the keyed hash
of its watch key. A context shows as `anonymous`, `public`, or a short hash of its name, the same for every
watch and log line of that context, so an operator can tell one user's watches from another's.
"""

from __future__ import annotations

import hashlib

from sidecar.changes import WatchKey, WatchKind
from sidecar.identity import ANONYMOUS, PUBLIC

__all__ = ["ANONYMOUS_LABEL", "context_label", "shown_uri"]

ANONYMOUS_LABEL = "anonymous"
_CONTEXT_HASH_CHARS = 8


def context_label(context: str) -> str:
    """`public`, `anonymous`, or 8 hex characters of a hash of the context's name (never a prefix of it)."""
    if context == PUBLIC:
        return PUBLIC
    if context == ANONYMOUS:
        return ANONYMOUS_LABEL
    return hashlib.sha256(context.encode()).hexdigest()[:_CONTEXT_HASH_CHARS]


def shown_uri(kind: WatchKind, uri: str | None, context: str) -> str | None:
    """The URI itself for a public or anonymous watch; `private:<hash of the watch key>` for an identified one
    (the hash the watch's log lines carry); None for a list, which has no URI."""
    if uri is None or context in (PUBLIC, ANONYMOUS):
        return uri
    return f"private:{WatchKey(kind, uri, context).short_hash}"
