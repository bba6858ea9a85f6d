"""How a stdio child's messages reach clients: answers checked, subscription ids and ids of the client's own,
SSE events; and a notification stream that ends with the child."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson

from sidecar.protocol.constants import META_SUBSCRIPTION_ID
from sidecar.protocol.envelope import RequestId
from sidecar.protocol.errors import UpstreamBadResponse
from sidecar.protocol.frames import modern_request_meta
from sidecar.upstream.stdio.child import StdioChild

__all__ = [
    "checked",
    "event",
    "for_subscription",
    "json_object",
    "response",
    "streamed",
    "until_ended",
    "with_modern_meta",
]

JsonObject = dict[str, Any]


async def until_ended(
    queue: asyncio.Queue[JsonObject], child: StdioChild, answer: asyncio.Future[JsonObject] | None
) -> AsyncIterator[JsonObject]:
    ends: set[asyncio.Future[Any]] = {child.ended} if answer is None else {child.ended, answer}
    while True:
        getter = asyncio.ensure_future(queue.get())
        try:
            done, _ = await asyncio.wait({getter, *ends}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            getter.cancel()
        if getter in done:
            yield getter.result()
        else:
            return


def streamed(method: str, params: JsonObject) -> bool:
    meta = params.get("_meta")
    return method == "subscriptions/listen" or (isinstance(meta, dict) and "progressToken" in meta)


def with_modern_meta(params: JsonObject) -> JsonObject:
    """A 2025-11-25 client's params with the `_meta` a 2026-07-28 child requires (its own keys, progressToken
    and the like, kept)."""
    meta = params.get("_meta")
    return {**params, "_meta": {**modern_request_meta(), **(meta if isinstance(meta, dict) else {})}}


def checked(upstream: str, answer: JsonObject) -> JsonObject:
    """The answer's `result` or `error`, or UpstreamBadResponse when it has neither (of the right shape)."""
    if isinstance(answer.get("error"), dict):
        return {"error": answer["error"]}
    if isinstance(answer.get("result"), dict):
        return {"result": answer["result"]}
    raise UpstreamBadResponse(upstream, "response has neither result nor error")


def response(request_id: RequestId | None, answer: JsonObject) -> JsonObject:
    return {"jsonrpc": "2.0", "id": request_id, **answer}


def for_subscription(notification: JsonObject, call_id: int, client_id: RequestId | None) -> JsonObject:
    """A frame of a listen stream the child tagged with our id, tagged with the client's instead."""
    params = notification.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(params, dict) or not isinstance(meta, dict) or meta.get(META_SUBSCRIPTION_ID) != call_id:
        return notification
    return {**notification, "params": {**params, "_meta": {**meta, META_SUBSCRIPTION_ID: client_id}}}


def event(message: JsonObject) -> bytes:
    return b"event: message\r\ndata: " + orjson.dumps(message) + b"\r\n\r\n"


def json_object(body: bytes | None) -> JsonObject | None:
    try:
        decoded = orjson.loads(body or b"")
    except orjson.JSONDecodeError:
        return None
    return decoded if isinstance(decoded, dict) else None
