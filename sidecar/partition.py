"""Authorization contexts: a keyed hash of the credential names a partition; the credential is never kept here."""

from __future__ import annotations

import hashlib
import hmac
import secrets

__all__ = ["ANONYMOUS", "PUBLIC", "context_id"]

PUBLIC = "public"
"""The partition of results whose cacheScope is public: shared by every client."""

ANONYMOUS = "anon"
"""The authorization context of requests without credentials."""

_PROCESS_KEY = secrets.token_bytes(32)


def context_id(authorization: str | None, key: bytes | None = None) -> str:
    """A short, stable, non-reversible name for the authorization context of a credential."""
    if not authorization:
        return ANONYMOUS
    digest = hmac.new(key or _PROCESS_KEY, authorization.encode("utf-8"), hashlib.sha256).hexdigest()
    return f"ctx-{digest[:20]}"
