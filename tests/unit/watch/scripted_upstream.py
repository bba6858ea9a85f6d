"""The upstream as the watch engine reads it (`Upstream.call`), answering from a script the test writes.

A stand-in for the engine's own logic only: the integration tests read real SDK upstreams.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from typing import Any

from sidecar.identity import Identity
from sidecar.protocol.errors import UpstreamError, UpstreamRpcError
from sidecar.protocol.types import JsonObject

__all__ = ["URL", "ScriptedUpstream", "contents"]

URL = "scripted://upstream"


def contents(uri: str, text: str, **extra: Any) -> JsonObject:
    """A `resources/read` result of one text content."""
    return {"contents": [{"uri": uri, "text": text}], **extra}


class ScriptedUpstream:
    """Resources by URI (or by URI and context), list pages by method, failures and a gate the test holds."""

    def __init__(self) -> None:
        self.recovery_listeners: list[Callable[[], None]] = []
        self.info: Any = None
        self.resources: dict[str, JsonObject] = {}
        self.private: dict[tuple[str, str], JsonObject] = {}
        """What one context reads at a URI, over `resources`."""
        self.pages: dict[str, list[JsonObject]] = {}
        """Each list method's pages: page n is asked for with the cursor `str(n)`."""
        self.errors: dict[str, JsonObject] = {}
        """A JSON-RPC error a method answers."""
        self.failure: UpstreamError | None = None
        self.gate: asyncio.Event | None = None
        self.calls: list[tuple[str, Any, str]] = []
        """(method, the URI or cursor asked for, the context it was asked as), in the order asked."""
        self.asked: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        """Set once a method is asked (the test clears it to wait for the next time)."""
        self.pushed: asyncio.Queue[JsonObject] = asyncio.Queue()
        """Notifications the upstream sends on its own, on the notification stream."""
        self.before_answer: Callable[[], None] | None = None
        """Called as a read's answer is handed back, in the same step (a test cancels a caller at that moment)."""

    @property
    def url(self) -> str:
        return URL

    async def ensure_info(self, identity: Identity) -> Any:
        """The era and capabilities the test set (`info`)."""
        return self.info

    def add_recovery_listener(self, listener: Callable[[], None]) -> Callable[[], None]:
        self.recovery_listeners.append(listener)
        return lambda: self.recovery_listeners.remove(listener) if listener in self.recovery_listeners else None

    def reads(self, uri: str) -> list[str]:
        """The contexts that read `uri`, in order."""
        return [context for method, asked, context in self.calls if method == "resources/read" and asked == uri]

    async def call(self, method: str, params: JsonObject, identity: Identity) -> JsonObject:
        self.calls.append((method, params.get("uri", params.get("cursor")), identity.context))
        self.asked[method].set()
        if self.gate is not None:
            await self.gate.wait()
        if self.before_answer is not None:
            self.before_answer()
        if self.failure is not None:
            raise self.failure
        if method in self.errors:
            raise UpstreamRpcError(URL, self.errors[method])
        if method in ("resources/subscribe", "resources/unsubscribe"):
            return {}
        if method == "resources/read":
            uri = params["uri"]
            result = self.private.get((uri, identity.context), self.resources.get(uri))
            if result is None:
                raise UpstreamRpcError(URL, {"code": -32002, "message": "Resource not found"})
            return result
        pages = self.pages.get(method)
        if pages is None:
            raise UpstreamRpcError(URL, {"code": -32601, "message": "Method not found"})
        return pages[int(params.get("cursor", 0))]

    @contextlib.asynccontextmanager
    async def open_notifications(
        self, identity: Identity, wanted: JsonObject
    ) -> AsyncIterator[AsyncIterator[JsonObject]]:
        """A 2025-11-25 session's stream: what the test pushes."""

        async def messages() -> AsyncIterator[JsonObject]:
            while True:
                yield await self.pushed.get()

        yield messages()
