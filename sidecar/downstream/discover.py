"""The sidecar's own `server/discover` result: the upstream's capabilities with the ones it synthesises."""

from __future__ import annotations

from sidecar.protocol import (
    META_CACHED,
    META_SERVER_INFO,
    META_UPSTREAM_SERVER_INFO,
    MODERN_VERSION,
    SERVER_INFO,
    JsonObject,
    synthesise_capabilities,
)
from sidecar.upstream.answers import UpstreamInfo

__all__ = ["DISCOVER_TTL_MS", "build_discover_result"]

DISCOVER_TTL_MS = 300_000
"""Capabilities change only when the upstream is replaced; clients may cache discover for five minutes."""


def build_discover_result(info: UpstreamInfo, *, subscriptions: bool, cached: bool = False) -> JsonObject:
    """The sidecar's own `server/discover`: the upstream's capabilities plus the ones the sidecar synthesises;
    `cached`: `info` is remembered from before an outage, and the answer says so in its `_meta`."""
    capabilities = {
        name: dict(value) if isinstance(value, dict) else value for name, value in info.capabilities.items()
    }
    capabilities.pop("logging", None)  # logging/setLevel is gone at 2026-07-28 (SEP-2577)
    if subscriptions:
        synthesise_capabilities(capabilities)
    meta: JsonObject = {META_SERVER_INFO: SERVER_INFO}
    if info.server_info is not None:
        meta[META_UPSTREAM_SERVER_INFO] = info.server_info
    if cached:
        meta[META_CACHED] = True
    result: JsonObject = {
        "resultType": "complete",
        "supportedVersions": [MODERN_VERSION],
        "capabilities": capabilities,
        "ttlMs": DISCOVER_TTL_MS,
        "cacheScope": "public",
        "_meta": meta,
    }
    if info.instructions is not None:
        result["instructions"] = info.instructions
    return result
