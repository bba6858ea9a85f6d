"""How the era is learned, whichever leg asks: `server/discover` first (unless `upstream.protocol` pins
2025-11-25), and `initialize` when the upstream refuses it (unless it pins 2026-07-28).

The bridge probes an HTTP upstream with it on demand; a stdio server's supervisor handshakes each child it
starts with it. Each leg says what a refusal is: over HTTP, the upstream's own error or HTTP status (a gateway's
502/503/504 or a transport failure is no era); over stdio, an error answer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from sidecar.protocol import (
    HANDSHAKE_VERSIONS,
    LEGACY_VERSION,
    MODERN_VERSION,
    SERVER_INFO,
    JsonObject,
    UpstreamBadResponse,
    UpstreamRpcError,
)
from sidecar.upstream.answers import UpstreamInfo

__all__ = ["INITIALIZE_PARAMS", "initialize_result", "learn_era"]

logger = logging.getLogger("sidecar.upstream")


INITIALIZE_PARAMS: JsonObject = {"protocolVersion": LEGACY_VERSION, "capabilities": {}, "clientInfo": SERVER_INFO}
"""The sidecar's own `initialize` (a 2025-11-25 session of its own, or a stdio child's handshake)."""

_SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"


async def learn_era(
    upstream: str,
    protocol: str,
    discover: Callable[[], Awaitable[JsonObject | None]],
    initialize: Callable[[], Awaitable[JsonObject]],
) -> tuple[UpstreamInfo, JsonObject]:
    """The era and what the upstream said of itself (its `server/discover` or `initialize` result).

    `discover` returns the result, or None when the upstream refused it (and raises what is no refusal);
    `initialize` returns a checked `initialize_result`."""
    if protocol != LEGACY_VERSION:
        result = await discover()
        versions = result.get("supportedVersions") if result is not None else None
        if result is not None and isinstance(versions, list) and MODERN_VERSION in versions:
            meta = result.get("_meta") if isinstance(result.get("_meta"), dict) else {}
            return UpstreamInfo.of("modern", result, (meta or {}).get(_SERVER_INFO_META)), result
        if protocol == MODERN_VERSION:
            raise UpstreamBadResponse(upstream, f"server/discover does not list {MODERN_VERSION}")
        logger.debug("server/discover refused; trying initialize", extra={"upstream": upstream})
    result = await initialize()
    return UpstreamInfo.of("legacy", result, result.get("serverInfo")), result


def initialize_result(upstream: str, answer: JsonObject) -> JsonObject:
    """The result of the sidecar's `initialize`, or the error that says why there is none."""
    if isinstance(answer.get("error"), dict):
        raise UpstreamRpcError(upstream, answer["error"])
    result = answer.get("result")
    if not isinstance(result, dict) or result.get("protocolVersion") not in HANDSHAKE_VERSIONS:
        raise UpstreamBadResponse(upstream, "initialize answered without a known protocolVersion")
    return result
