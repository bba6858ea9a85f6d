"""Auth pass-through: the upstream's challenges and protected-resource metadata, pointed at the sidecar."""

from __future__ import annotations

import contextlib
import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sidecar.config import UpstreamConfig
from sidecar.protocol import JsonObject, UpstreamError
from sidecar.upstream.answers import json_object
from sidecar.upstream.http.endpoint import UpstreamHTTP

__all__ = ["OAuthProtection", "metadata_paths", "rewrite_challenge", "rewrite_metadata"]

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


class OAuthProtection:
    """An HTTP upstream's OAuth protection as a client sees it through the sidecar (a `Protection`): its
    challenges and its metadata, pointed at `public_url` when that is set."""

    def __init__(self, config: UpstreamConfig, http: UpstreamHTTP) -> None:
        self._config = config
        self._http = http

    def public_headers(self, headers: dict[str, str]) -> dict[str, str]:
        """Response headers for the client: an auth challenge points at the sidecar when public_url is set."""
        public_url = self._config.public_url
        if public_url is None:
            return headers
        return {
            name: rewrite_challenge(value, public_url) if name.lower() == "www-authenticate" else value
            for name, value in headers.items()
        }

    async def protected_resource_metadata(self, public_url: str) -> JsonObject | None:
        """The upstream's OAuth protected-resource metadata, rewritten to name `public_url`; None if it has none."""
        parts = urlsplit(self._config.url)
        for path in metadata_paths(self._config.url):
            url = urlunsplit((parts.scheme, parts.netloc, path, "", ""))
            with contextlib.suppress(UpstreamError):
                status, body = await self._http.get(url, self._http.max_response_bytes)
                document = json_object(body) if status == 200 else None
                if document is not None:
                    return rewrite_metadata(document, public_url)
        return None
