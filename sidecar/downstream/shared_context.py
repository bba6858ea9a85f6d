"""One authorization context for every client, when the upstream is a stdio server: `Authorization` goes nowhere.

A stdio server has no HTTP, hence no HTTP auth: whatever clients send as `Authorization` could never
reach it, and keying watches and cache entries by it would only multiply polls of the same data.
The header is taken off each request before anything reads it, and the first time a client sends one
the log says so (once per process).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware
from multidict import CIMultiDict

from sidecar.protocol import HEADER_AUTHORIZATION

__all__ = ["ignore_authorization"]

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def ignore_authorization(upstream: str) -> Middleware:
    """Middleware dropping `Authorization` from every request (logged the first time a client sends one)."""
    told = False

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        nonlocal told
        if HEADER_AUTHORIZATION not in request.headers:
            return await handler(request)
        if not told:
            told = True
            logger.warning(
                "a client sent Authorization, but the upstream is a stdio server without HTTP auth: the header is "
                "ignored, and every client shares one authorization context",
                extra={"upstream": upstream},
            )
        headers = CIMultiDict(request.headers)
        del headers[HEADER_AUTHORIZATION]
        return await handler(request.clone(headers=headers))

    return middleware
