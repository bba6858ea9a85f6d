"""Auth pass-through: the upstream's challenges and protected-resource metadata, pointed at the sidecar."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["metadata_paths", "rewrite_challenge", "rewrite_metadata"]

_RESOURCE_METADATA = re.compile(r'(resource_metadata=")([^"]*)(")')
WELL_KNOWN = "/.well-known/oauth-protected-resource"


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


def rewrite_challenge(value: str, public_url: str) -> str:
    """`WWW-Authenticate` with its `resource_metadata` URL moved to the sidecar's public origin."""
    scheme, netloc = _origin(public_url)

    def moved(match: re.Match[str]) -> str:
        parts = urlsplit(match.group(2))
        return match.group(1) + urlunsplit(parts._replace(scheme=scheme, netloc=netloc)) + match.group(3)

    return _RESOURCE_METADATA.sub(moved, value)


def rewrite_metadata(document: dict[str, Any], public_url: str) -> dict[str, Any]:
    """Protected-resource metadata naming the sidecar as the resource clients talk to (RFC 9728)."""
    return {**document, "resource": public_url}


def metadata_paths(upstream_url: str) -> list[str]:
    """Where the upstream may publish its metadata: path-specific first, then the root (RFC 9728 §3)."""
    path = urlsplit(upstream_url).path.rstrip("/")
    return [WELL_KNOWN + path, WELL_KNOWN] if path else [WELL_KNOWN]
