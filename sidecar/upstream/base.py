"""What the rest of the sidecar uses of its upstream, as small roles, whichever way the upstream is reached.

One class serves them all, `UpstreamBridge` (`bridge.py`), over an HTTP or a stdio transport; `app.py` builds
it from the configuration. Each consumer types against the roles it uses, so what it depends on is said where
it is used: the endpoint forwards (`Forward`), 2025-11-25 client sessions relay (`Relay`), listen streams learn
the era (`LearnEra`), the watch engine reads on its own behalf (`Look`), opens the upstream's notification
stream (`OpenNotifications`) and hears when it answers again (`Watched`: all three), /readyz and /status read
its health (`Health`), and the app starts and stops it (`Lifecycle`). `Upstream` is all of them, for the one
place that builds and hands the bridge out.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from multidict import CIMultiDictProxy

from sidecar.identity import ANONYMOUS_IDENTITY, Identity
from sidecar.protocol import JsonObject

if TYPE_CHECKING:
    from sidecar.protocol import Message
    from sidecar.upstream.answers import Reply, UpstreamInfo

__all__ = [
    "Forward",
    "Headers",
    "Health",
    "LearnEra",
    "Lifecycle",
    "Look",
    "NotificationListener",
    "NotificationSource",
    "OpenNotifications",
    "Relay",
    "Upstream",
    "Watched",
]

Headers = CIMultiDictProxy[str] | Mapping[str, str]

NotificationListener = Callable[[JsonObject], None]
"""Told each JSON-RPC notification the upstream sends on its own (not as part of answering one request).
Synchronous; it must not raise (a raising listener is logged and skipped)."""


class LearnEra(Protocol):
    """The upstream's era and capabilities."""

    @property
    def url(self) -> str:
        """The upstream as it may be shown (credentials masked; `stdio: <command>` for a child process)."""
        ...

    @property
    def info(self) -> UpstreamInfo | None:
        """The era and capabilities learned by the last probe; None before one succeeded."""
        ...

    async def ensure_info(self, identity: Identity = ANONYMOUS_IDENTITY) -> UpstreamInfo:
        """The upstream's era and capabilities, probed (as `identity`) when not known yet."""
        ...

    async def discovery(self, identity: Identity = ANONYMOUS_IDENTITY) -> tuple[UpstreamInfo, bool]:
        """What a client of `identity`'s context connects with: `ensure_info` (False), or, while the upstream
        cannot be reached, the last one learned for that context (True: remembered); with none, the failure."""
        ...

    async def reached(self) -> UpstreamInfo:
        """The era and capabilities once the upstream can be used, waiting (however long) until it can."""
        ...


class Forward(LearnEra, Protocol):
    """A modern client's request on its way upstream, and what the answer's headers may say."""

    def public_headers(self, headers: dict[str, str]) -> dict[str, str]: ...

    async def protected_resource_metadata(self, public_url: str) -> JsonObject | None: ...

    async def forward(self, message: Message, client_headers: Headers, identity: Identity) -> Reply:
        """A modern client's request, answered in the client's era."""
        ...


class Relay(LearnEra, Protocol):
    """A 2025-11-25 client session's messages, passed through."""

    def public_headers(self, headers: dict[str, str]) -> dict[str, str]: ...

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


class Look(Protocol):
    """The sidecar's own requests (a poll)."""

    @property
    def url(self) -> str: ...

    async def call(self, method: str, params: JsonObject, identity: Identity = ANONYMOUS_IDENTITY) -> JsonObject:
        """One request on the sidecar's own behalf (a poll), as `identity`: the result, or an UpstreamError."""
        ...


class OpenNotifications(Look, Protocol):
    """The upstream's own notifications, used as hints (subscribing at 2025-11-25 is a `call`)."""

    @property
    def info(self) -> UpstreamInfo | None: ...

    async def ensure_info(self, identity: Identity = ANONYMOUS_IDENTITY) -> UpstreamInfo:
        """The era and capabilities (which say how to open the stream), probed as `identity` when not known yet."""
        ...

    def open_notifications(
        self, identity: Identity, wanted: JsonObject
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[JsonObject]]:
        """The upstream's own notifications for `identity`, held open for the block: against a 2026-07-28 upstream
        a `subscriptions/listen` with the filter `wanted` (its first message is the ack); against a 2025-11-25
        one every notification it sends on its own (the caller subscribes with `call("resources/subscribe")`)."""
        ...


class Watched(OpenNotifications, Protocol):
    """What the watch engine holds: its looks, the upstream's notifications, and the word that it answers again."""

    def add_recovery_listener(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Tell `listener` each time the upstream can be used again after being unreachable or unusable (every
        failing watch re-reads then); returns an idempotent remover."""
        ...


class Health(Protocol):
    """Whether the upstream can be used now, and why not."""

    @property
    def url(self) -> str: ...

    @property
    def info(self) -> UpstreamInfo | None: ...

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

    @property
    def retry_in_s(self) -> float | None:
        """Seconds until the sidecar asks the unreachable upstream again; None when it is not down (or, for a
        stdio server, the restart is said in `last_error`)."""
        ...

    async def check(self) -> bool:
        """Readiness: True when the upstream answers (probed again when not heard from lately)."""
        ...

    async def answers_now(self) -> bool:
        """One exchange with the upstream, started now (whatever was heard lately): True when it answered. A replica
        asks before it takes the keys of a peer that cannot read."""
        ...

    async def reached(self) -> UpstreamInfo:
        """The era and capabilities once the upstream has answered, waiting (however long) until it has."""
        ...

    async def ensure_info(self, identity: Identity = ANONYMOUS_IDENTITY) -> UpstreamInfo: ...


class Lifecycle(Protocol):
    """Starting and stopping the way to the upstream."""

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    def drain(self, grace_s: float) -> None:
        """Shutdown has begun: requests still waiting near the end of `grace_s` are answered with an error."""
        ...


class Upstream(Forward, Relay, Watched, Health, Lifecycle, Protocol):
    """Every role: what `app.py` builds and hands out (each consumer keeps only the roles it uses)."""


@runtime_checkable
class NotificationSource(Protocol):
    """An upstream that hands over the notifications it sends on its own (a stdio server: list changes,
    resource updates, log messages), for the watch engine to use as hints."""

    def add_notification_listener(self, listener: NotificationListener) -> Callable[[], None]:
        """Register `listener`; returns a remover that may be called any number of times."""
        ...
