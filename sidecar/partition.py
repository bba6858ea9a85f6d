"""Authorization contexts: a keyed hash of the credential names a partition; the credential is never kept here."""

from __future__ import annotations

import hashlib
import hmac
import secrets

__all__ = ["ANONYMOUS", "PUBLIC", "context_id", "set_partition_key"]

PUBLIC = "public"
"""The partition of results whose cacheScope is public: shared by every client."""

ANONYMOUS = "anon"
"""The authorization context of requests without credentials."""

_key = secrets.token_bytes(32)


def set_partition_key(key: bytes) -> None:
    """Use a key shared by every replica (from Redis), so one credential names one context cluster-wide."""
    global _key
    _key = key


def context_id(authorization: str | None, key: bytes | None = None) -> str:
    """A short, stable, non-reversible name for the authorization context of a credential."""
    if not authorization:
        return ANONYMOUS
    digest = hmac.new(key or _key, authorization.encode("utf-8"), hashlib.sha256).hexdigest()
    return f"ctx-{digest[:20]}"
