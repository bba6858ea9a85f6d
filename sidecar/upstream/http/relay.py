"""Relaying an upstream's SSE answer to the client, so that a broken answer still ends as a JSON-RPC error.

Once the sidecar has sent 200 and `text/event-stream`, it cannot change the status any more. If the
upstream's stream then breaks off (a cut body, a timeout, the sidecar's own shutdown), grows an event
larger than `upstream.max_response_bytes`, or ends without the response, the client gets one last
event carrying a JSON-RPC error for its request, instead of a cut stream it would wait on forever.
Events are relayed whole, as each completes, so a partial event never reaches the client; they are
re-framed (`sse.frame`), so events without data (a resumable server's priming event) and the `id:`
and `retry:` fields of a resumption the sidecar does not offer never reach it either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Protocol

import orjson

from sidecar.protocol import RequestId, UpstreamBadResponse, UpstreamError, UpstreamTimeout, error_response
from sidecar.upstream.sse import SSEDecoder, SSEEvent, SSETooLarge, frame

__all__ = ["BodyChunks", "relay_answer", "relay_events", "request_id_of"]

logger = logging.getLogger(__name__)


def request_id_of(body: bytes | None) -> RequestId | None:
    """The id of a JSON-RPC request body (None for anything else: a notification, a response, not JSON)."""
    if not body:
        return None
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(message, dict) or "method" not in message:
        return None
    request_id = message.get("id")
    if isinstance(request_id, str) or (isinstance(request_id, int) and not isinstance(request_id, bool)):
        return request_id
    return None


class BodyChunks(Protocol):
    """An upstream answer's body as it arrives (the wire's `Answer`)."""

    def iter_any(self) -> AsyncIterator[bytes]: ...


async def relay_answer(
    content: BodyChunks,
    request_id: RequestId,
    *,
    upstream: str,
    limit: int,
    max_s: float | None = None,
) -> AsyncGenerator[bytes, None]:
    """The events of the upstream's answer to `request_id`, each whole; an error event if it never comes, or if
    it has not come `max_s` seconds after the stream began (silence alone is the read timeout's to end)."""
    decoder = SSEDecoder(limit)
    answered = False
    failure: UpstreamError
    loop = asyncio.get_running_loop()
    ends_at = None if max_s is None else loop.time() + max_s
    try:
        async for chunk in content.iter_any():
            if ends_at is not None and loop.time() > ends_at and not answered:
                raise UpstreamTimeout(upstream, f"no answer within max_stream_s ({max_s:g} s)")
            for event in _decode(decoder, chunk, upstream):
                answered = answered or _answers(event, request_id)
                yield frame(event)
        if answered:
            return
        failure = UpstreamBadResponse(upstream, "stream ended without a response")
    except UpstreamError as exc:
        if answered:
            logger.info("upstream stream broke off after its response", extra={"reason": exc.reason})
            return
        failure = exc
    yield frame(SSEEvent(orjson.dumps(error_response(request_id, failure.to_rpc())).decode()))


async def relay_events(content: BodyChunks, *, upstream: str, limit: int) -> AsyncGenerator[bytes, None]:
    """A stream that answers no one request (a legacy session's GET stream): events as they complete; a
    failure ends it quietly (the client reconnects), never as an exception in the middle of a response."""
    decoder = SSEDecoder(limit)
    try:
        async for chunk in content.iter_any():
            for event in _decode(decoder, chunk, upstream):
                yield frame(event)
    except UpstreamError as exc:
        logger.info("upstream stream ended", extra={"upstream": upstream, "reason": exc.reason})


def _decode(decoder: SSEDecoder, chunk: bytes, upstream: str) -> list[SSEEvent]:
    try:
        return decoder.feed(chunk)
    except SSETooLarge as exc:
        raise UpstreamBadResponse(upstream, str(exc)) from exc


def _answers(event: SSEEvent, request_id: RequestId) -> bool:
    if "result" not in event.data and "error" not in event.data:
        return False  # progress and other notifications: no need to decode them
    try:
        message = orjson.loads(event.data)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(message, dict) or not ("result" in message or "error" in message):
        return False
    answer_id = message.get("id")
    return type(answer_id) is type(request_id) and answer_id == request_id  # 1 is not true
