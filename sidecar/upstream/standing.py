"""The start-up line: where the upstream stands when the sidecar starts, in one log line.

Reachable: its era (the revision it speaks), whether it can push (its own notifications, used as hints), and
the interval a watch polls at when the upstream's results carry no ttlMs. Unreachable: why, and that it is
retried with backoff; once it answers, the reachable line follows. A protected upstream that refuses the
sidecar's anonymous probe is reachable: its era is learned with the first client's credentials.
"""

from __future__ import annotations

import logging
from typing import Any

from sidecar.config import CacheConfig, PollingConfig
from sidecar.protocol import UpstreamError, UpstreamHTTPError
from sidecar.upstream.answers import UpstreamInfo
from sidecar.upstream.base import Upstream

__all__ = ["announce_upstream", "can_push", "polling_interval_ms"]

logger = logging.getLogger("sidecar.upstream")

_PUSH_CAPABILITIES = (("resources", "subscribe"), ("resources", "listChanged"), ("tools", "listChanged"),
                      ("prompts", "listChanged"))  # fmt: skip


def can_push(info: UpstreamInfo, polling: PollingConfig) -> bool:
    """Whether the sidecar will use the upstream's own notifications (it declares them, and they are not off)."""
    capabilities = info.capabilities
    declared = any(
        isinstance(capabilities.get(primitive), dict) and capabilities[primitive].get(flag) is True
        for primitive, flag in _PUSH_CAPABILITIES
    )
    return declared and polling.native_notifications


def polling_interval_ms(info: UpstreamInfo, polling: PollingConfig, cache: CacheConfig) -> int:
    """The poll interval of a watch whose results carry no ttlMs of the upstream's own (a 2025-11-25 upstream's
    never do: they are stamped with cache.default_ttl_ms), within polling's bounds; `native_backstop_ms` when
    the upstream's notifications cover it."""
    if can_push(info, polling) and polling.native_backstop_ms:
        return polling.native_backstop_ms
    ttl_ms = cache.default_ttl_ms if info.era == "legacy" else 0
    return min(max(ttl_ms or polling.default_interval_ms, polling.min_interval_ms), polling.max_interval_ms)


async def announce_upstream(upstream: Upstream, polling: PollingConfig, cache: CacheConfig) -> None:
    """Probe the upstream once the sidecar starts and log where it stands; when it cannot be reached, wait for
    the retries (the upstream's own, with backoff) to reach it, and log that."""
    try:
        info = await upstream.ensure_info()
    except UpstreamError as exc:
        if isinstance(exc, UpstreamHTTPError) and exc.is_auth_failure:
            logger.info(
                "upstream reachable",
                extra={"upstream": upstream.url, "era": None, "auth_required": True, "reason": exc.reason},
            )
            return
        if exc.is_transport_failure:
            extra: dict[str, Any] = {"upstream": upstream.url, "reason": upstream.not_ready_reason or exc.reason}
            if upstream.retry_in_s is not None:  # a stdio server's reason says when it is started again
                extra["retry_in_s"] = upstream.retry_in_s
            logger.warning("upstream unreachable", extra=extra)  # the same line as an outage's first
        # else: an upstream that answers but is unusable has said so already ("upstream unusable").
        info = await upstream.reached()
    logger.info(
        "upstream reachable",
        extra={
            "upstream": upstream.url,
            "era": info.revision,
            "push": can_push(info, polling),
            "polling_interval_ms": polling_interval_ms(info, polling, cache),
        },
    )
