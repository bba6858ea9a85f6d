"""How many requests one client (authorization context) may have in flight upstream; a live answer holds its
slot until it ends, however it ends."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from sidecar.identity import Identity
from sidecar.observability.metrics import Metrics
from sidecar.protocol.errors import TooManyRequests
from sidecar.upstream.answers import ReleasingStream, Reply

__all__ = ["InFlightLimit"]


class InFlightLimit:
    """`upstream.max_requests_per_context`: more get TooManyRequests (429), so one client cannot take the whole
    connection pool while others wait."""

    def __init__(self, per_context: int, metrics: Metrics) -> None:
        self._per_context = per_context
        self._metrics = metrics
        self._in_flight: dict[str, int] = {}

    async def run(self, identity: Identity, send: Callable[[], Awaitable[Reply]]) -> Reply:
        """`send` while the client has a free slot (a live answer counts until it ends)."""
        context = identity.context
        in_flight = self._in_flight.get(context, 0)
        if in_flight >= self._per_context:
            self._metrics.limit_rejections.labels("requests_per_context").inc()
            raise TooManyRequests(f"this client already has {in_flight} requests in flight; retry when one ends")
        self._in_flight[context] = in_flight + 1

        def release() -> None:
            left = self._in_flight.get(context, 1) - 1
            if left > 0:
                self._in_flight[context] = left
            else:
                self._in_flight.pop(context, None)

        try:
            reply = await send()
        except BaseException:
            release()
            raise
        if reply.stream is not None:
            reply.stream = ReleasingStream(reply.stream, release)
        else:
            release()
        return reply
