"""How a stdio child's messages reach clients: which requests stream, subscription ids and ids of the client's
own, SSE events; and a notification stream that ends with the child."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson

from sidecar.protocol import META_SUBSCRIPTION_ID, JsonObject, RequestId
from sidecar.upstream.stdio.child import StdioChild

__all__ = ["event", "for_subscription", "streamed", "until_ended"]


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


def for_subscription(notification: JsonObject, call_id: int, client_id: RequestId | None) -> JsonObject:
    """A frame of a listen stream the child tagged with our id, tagged with the client's instead."""
    params = notification.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(params, dict) or not isinstance(meta, dict) or meta.get(META_SUBSCRIPTION_ID) != call_id:
        return notification
    return {**notification, "params": {**params, "_meta": {**meta, META_SUBSCRIPTION_ID: client_id}}}


def event(message: JsonObject) -> bytes:
    return b"event: message\r\ndata: " + orjson.dumps(message) + b"\r\n\r\n"
