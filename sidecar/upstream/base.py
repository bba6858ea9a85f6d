"""What the rest of the sidecar uses of its upstream, whichever way it is reached: the `Upstream` protocol.

Two classes have this surface: `UpstreamClient` (an MCP server over HTTP) and `StdioUpstream` (an MCP
server the sidecar starts as a child process and speaks to on its stdin and stdout). `app.py` picks
one from the configuration; the endpoint, listen streams, legacy sessions, the watch engine, /readyz,
/status and /metrics hold it as an `Upstream` and never know which.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from multidict import CIMultiDictProxy

from sidecar.identity import ANONYMOUS_IDENTITY, Identity

if TYPE_CHECKING:
    from sidecar.protocol.envelope import Message
    from sidecar.upstream.answers import Reply, UpstreamInfo

__all__ = ["Headers", "NotificationListener", "NotificationSource", "Upstream"]

JsonObject = dict[str, Any]
Headers = CIMultiDictProxy[str] | Mapping[str, str]

NotificationListener = Callable[[JsonObject], None]
"""Told each JSON-RPC notification the upstream sends on its own (not as part of answering one request).
Synchronous; it must not raise (a raising listener is logged and skipped)."""


class Upstream(Protocol):
    """The upstream as the sidecar uses it: era detection, forwarding, legacy sessions, its own polls, health."""

    on_recovered: Callable[[], None] | None
    """Called when the upstream answers again after being unreachable (every failing watch re-reads then)."""

    @property
    def url(self) -> str:
        """The upstream as it may be shown (credentials masked; `stdio: <command>` for a child process)."""
        ...

    @property
    def info(self) -> UpstreamInfo | None:
        """The era and capabilities learned by the last probe; None before one succeeded."""
        ...

    @property
    def up(self) -> bool | None:
        """True while the upstream answers; False while it does not; None before the first try."""
        ...

    @property
    def last_error(self) -> str | None:
        """Why the upstream is not up, in words (for /readyz and /status)."""
        ...

    @property
    def unusable(self) -> str | None:
        """Why an upstream that answers cannot be used (its answers are not MCP), or None."""
        ...

    @property
    def not_ready_reason(self) -> str | None:
        """Why the sidecar cannot serve now (unreachable, unusable, not probed yet), or None when it can."""
        ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    def drain(self, grace_s: float) -> None:
        """Shutdown has begun: requests still waiting near the end of `grace_s` are answered with an error."""
        ...

    async def ensure_info(self, identity: Identity = ANONYMOUS_IDENTITY) -> UpstreamInfo:
        """The upstream's era and capabilities, probed (as `identity`) when not known yet."""
        ...

    async def check(self) -> bool:
        """Readiness: True when the upstream answers (probed again when not heard from lately)."""
        ...

    async def reached(self) -> UpstreamInfo:
        """The era and capabilities once the upstream has answered, waiting (however long) until it has."""
        ...

    @property
    def retry_in_s(self) -> float | None:
        """Seconds until the sidecar asks the unreachable upstream again; None when it is not down (or, for a
        stdio server, the restart is said in `last_error`)."""
        ...

    def public_headers(self, headers: dict[str, str]) -> dict[str, str]: ...

    async def protected_resource_metadata(self, public_url: str) -> JsonObject | None: ...

    async def forward(self, message: Message, client_headers: Headers, identity: Identity) -> Reply:
        """A modern client's request, answered in the client's era."""
        ...

    async def relay(
        self,
        body: bytes | None,
        client_headers: Headers,
        identity: Identity,
        *,
        session_id: str | None = None,
        http_method: str = "POST",
    ) -> Reply:
        """A 2025-11-25 client session's message, on the upstream session `session_id` (None: `initialize`)."""
        ...

    async def call(self, method: str, params: JsonObject, identity: Identity = ANONYMOUS_IDENTITY) -> JsonObject:
        """One request on the sidecar's own behalf (a poll), as `identity`: the result, or an UpstreamError."""
        ...

    def open_notifications(
        self, identity: Identity, wanted: JsonObject
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[JsonObject]]:
        """The upstream's own notifications for `identity`, held open for the block: against a 2026-07-28 upstream
        a `subscriptions/listen` with the filter `wanted` (its first message is the ack); against a 2025-11-25
        one every notification it sends on its own (the caller subscribes with `call("resources/subscribe")`)."""
        ...


@runtime_checkable
class NotificationSource(Protocol):
    """An upstream that hands over the notifications it sends on its own (a stdio server: list changes,
    resource updates, log messages), for the watch engine to use as hints."""

    def add_notification_listener(self, listener: NotificationListener) -> Callable[[], None]:
        """Register `listener`; returns a remover that may be called any number of times."""
        ...
