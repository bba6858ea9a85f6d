"""One authorization context's stream of the upstream's own notifications (see `sidecar.watch.native`): opened,
refiltered as the context's keys come and go, reopened with backoff when it breaks, and what it covers told to
its owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

from sidecar.backoff import Backoff
from sidecar.changes import WatchKind
from sidecar.identity import Identity
from sidecar.protocol.constants import RESOURCE_UPDATED_METHOD
from sidecar.protocol.errors import UpstreamError, UpstreamHTTPError, UpstreamRpcError
from sidecar.protocol.lists import LIST_KIND_OF_NOTIFICATION, LIST_KINDS
from sidecar.protocol.types import JsonObject
from sidecar.upstream.base import OpenNotifications
from sidecar.watch.clock import Clock, sleep, within

__all__ = ["FILTER_FIELDS", "NativeStream", "StreamOwner", "capability"]

logger = logging.getLogger("sidecar.watch.native")  # the feature's name, which its log lines are filtered by

_KIND_OF_METHOD: dict[str, WatchKind] = dict(LIST_KIND_OF_NOTIFICATION)
FILTER_FIELDS: dict[WatchKind, tuple[str, str]] = {
    row.kind: (row.filter_field, row.primitive) for row in LIST_KINDS.values()
}
_REFILTER_DEBOUNCE_S = 0.05
"""A burst of new subscriptions becomes one new upstream listen, not one each."""
RETRY = Backoff(0.5, 30.0, jitter=0.5)
"""Backoff between attempts to reopen a broken stream: from half a second to half a minute, each wait between half
and one and a half times its step."""
_STEADY_S = RETRY.maximum
"""A stream up this long that breaks starts a new streak of failures (backoff from the start, logged again); one
that breaks sooner (an upstream or proxy that acknowledges, then closes) goes on with its streak's backoff."""
_ACK_TIMEOUT_S = 10.0


def capability(capabilities: JsonObject, primitive: str, flag: str) -> bool:
    value = capabilities.get(primitive)
    return isinstance(value, dict) and value.get(flag) is True


class StreamOwner(Protocol):
    """What a stream needs of the streams' owner (`NativeNotifications`): the upstream and its clock, and where
    what it hears and covers goes."""

    upstream: OpenNotifications
    clock: Clock
    unsupported: bool

    @property
    def capabilities(self) -> JsonObject: ...

    @property
    def modern(self) -> bool: ...

    def hint(self, kind: WatchKind, uri: str | None, context: str, *, warm: bool) -> None: ...

    def coverage_changed(self, kind: WatchKind, uri: str | None, context: str) -> None: ...

    def received(self, method: str) -> None: ...

    def streams_open(self, delta: int) -> None: ...


class NativeStream:
    """One context's stream of upstream notifications and what it covers."""

    def __init__(self, owner: StreamOwner, identity: Identity) -> None:
        self.owner = owner
        self.context = identity.context
        self.identity = identity
        self.uris: dict[str, int] = {}
        self.lists: dict[WatchKind, int] = {}
        self.covered_uris: frozenset[str] = frozenset()
        self.covered_lists: frozenset[WatchKind] = frozenset()
        self.changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self._opened_at: float | None = None
        """When the stream that is open now was opened (on the owner's clock); None while none is."""

    @property
    def wanted(self) -> bool:
        return bool(self.uris or self.lists)

    @property
    def open(self) -> bool:
        """A stream of the upstream's notifications is open now (a 2025-11-25 one hears every notification)."""
        return self._opened_at is not None

    def covers(self, kind: WatchKind, uri: str | None) -> bool:
        return uri in self.covered_uris if kind == "resource" else kind in self.covered_lists

    def cover(self, uris: frozenset[str], lists: frozenset[WatchKind], *, hint_new: bool) -> None:
        """Record what the upstream covers now; keys newly covered are polled once (see the module docstring)."""
        before = _keys(self.covered_uris, self.covered_lists)
        after = _keys(uris, lists)
        self.covered_uris, self.covered_lists = uris, lists
        for kind, uri in after ^ before:
            self.owner.coverage_changed(kind, uri, self.context)
        if hint_new:
            for kind, uri in after - before:
                self.owner.hint(kind, uri, self.context, warm=False)

    def dispatch(self, message: JsonObject) -> None:
        method = message.get("method")
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        if method == RESOURCE_UPDATED_METHOD and isinstance(params.get("uri"), str):
            self.owner.received(method)
            self.owner.hint("resource", params["uri"], self.context, warm=True)
        elif method in _KIND_OF_METHOD:
            self.owner.received(str(method))
            self.owner.hint(_KIND_OF_METHOD[str(method)], None, self.context, warm=True)

    async def run(self) -> None:
        failures = 0
        while self.wanted:
            try:
                # The era and capabilities first: after an outage they are probed afresh, and a stream opened
                # before would take a 2026-07-28 upstream for a 2025-11-25 one, or subscribe to nothing.
                await self.owner.upstream.ensure_info(self.identity)
                if self.owner.modern:
                    await self._serve_listen()
                else:
                    await self._serve_session_stream()
                failures = 0
            except UpstreamError as exc:
                failures = 1 if self._steady() else failures + 1
                if failures == 1:
                    logger.info("upstream notification stream failed", extra={"reason": exc.reason})
                if _unsupported(exc):
                    logger.info(
                        "the upstream serves no notification stream; polling only", extra={"reason": exc.reason}
                    )
                    self.owner.unsupported = True
                    return
            except Exception:  # boundary: a bug here must leave polling working, never stop it
                failures = 1 if self._steady() else failures + 1
                logger.exception("upstream notification stream crashed")
            finally:
                self._closed()
            if self.wanted:
                await sleep(self.owner.clock, RETRY.delay(failures))

    def _steady(self) -> bool:
        return self._opened_at is not None and self.owner.clock.now() - self._opened_at >= _STEADY_S

    def _opened(self) -> None:
        if self._opened_at is None:
            self._opened_at = self.owner.clock.now()
            self.owner.streams_open(1)

    def _closed(self) -> None:
        if self._opened_at is not None:
            self._opened_at = None
            self.owner.streams_open(-1)
        self.cover(frozenset(), frozenset(), hint_new=False)  # uncovered keys poll now and at their usual pace

    def _filter(self) -> JsonObject:
        capabilities = self.owner.capabilities
        wanted: JsonObject = {}
        for kind in self.lists:
            field, primitive = FILTER_FIELDS[kind]
            if capability(capabilities, primitive, "listChanged"):
                wanted[field] = True
        if self.uris and capability(capabilities, "resources", "subscribe"):
            wanted["resourceSubscriptions"] = sorted(self.uris)
        return wanted

    async def _serve_listen(self) -> None:
        """2026-07-28: a listen with this context's filter; a new filter opens a new listen before the old one
        closes, so no notification falls between the two."""
        current: tuple[contextlib.AsyncExitStack, asyncio.Task[None]] | None = None
        try:
            while self.wanted:
                self.changed.clear()
                wanted = self._filter()
                if not wanted:
                    return
                stack = contextlib.AsyncExitStack()
                try:
                    upstream = self.owner.upstream
                    messages = await stack.enter_async_context(upstream.open_notifications(self.identity, wanted))
                    ack = await self._acknowledgment(messages)
                    reader = asyncio.get_running_loop().create_task(self._read(messages))
                except BaseException:
                    await stack.aclose()
                    raise
                # Kept before the old one closes: a cancellation while it closes must close the new one too.
                previous, current = current, (stack, reader)
                if previous is not None:
                    await _close(previous)
                self._opened()
                honoured = _honoured(ack)
                uris = frozenset(u for u in honoured.get("resourceSubscriptions", []) if isinstance(u, str))
                lists = frozenset(k for k, (field, _) in FILTER_FIELDS.items() if honoured.get(field) is True)
                self.cover(uris, lists, hint_new=True)
                await self._until_changed_or_ended(reader)
                await sleep(self.owner.clock, _REFILTER_DEBOUNCE_S)
        finally:
            if current is not None:
                await _close(current)

    async def _serve_session_stream(self) -> None:
        """2025-11-25: the context session's GET stream; URIs are subscribed to one by one on that session."""
        capabilities = self.owner.capabilities
        subscribe = capability(capabilities, "resources", "subscribe")
        async with self.owner.upstream.open_notifications(self.identity, {}) as messages:
            reader = asyncio.get_running_loop().create_task(self._read(messages))
            self._opened()
            subscribed: set[str] = set()
            try:
                while self.wanted:
                    self.changed.clear()
                    for uri in sorted(set(self.uris) - subscribed) if subscribe else ():
                        try:
                            await self.owner.upstream.call("resources/subscribe", {"uri": uri}, self.identity)
                            subscribed.add(uri)
                        except UpstreamRpcError:
                            continue  # refused for this URI: it stays polled
                    for uri in subscribed - set(self.uris):
                        subscribed.discard(uri)
                        with contextlib.suppress(UpstreamError):
                            await self.owner.upstream.call("resources/unsubscribe", {"uri": uri}, self.identity)
                    lists = frozenset(
                        kind for kind in self.lists if capability(capabilities, FILTER_FIELDS[kind][1], "listChanged")
                    )
                    self.cover(frozenset(subscribed), lists, hint_new=True)
                    await self._until_changed_or_ended(reader)
                    await sleep(self.owner.clock, _REFILTER_DEBOUNCE_S)
            finally:
                reader.cancel()

    async def _acknowledgment(self, messages: Any) -> JsonObject:
        try:
            ack: JsonObject = await within(self.owner.clock, _ACK_TIMEOUT_S, anext(messages))
        except StopAsyncIteration:
            raise _StreamEnded from None
        except TimeoutError:
            raise UpstreamError(self.owner.upstream.url, f"no acknowledgment within {_ACK_TIMEOUT_S:g} s") from None
        return ack

    async def _until_changed_or_ended(self, reader: asyncio.Task[None]) -> None:
        changed = asyncio.get_running_loop().create_task(self.changed.wait())
        try:
            await asyncio.wait({changed, reader}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
        if reader.done():
            reader.result()  # the stream's failure, if it failed
            raise _StreamEnded

    async def _read(self, messages: Any) -> None:
        async with contextlib.aclosing(messages):
            async for message in messages:
                self.dispatch(message)


async def _close(opened: tuple[contextlib.AsyncExitStack, asyncio.Task[None]]) -> None:
    stack, reader = opened
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    await stack.aclose()


def _keys(uris: frozenset[str], lists: frozenset[WatchKind]) -> set[tuple[WatchKind, str | None]]:
    keys: set[tuple[WatchKind, str | None]] = {(kind, None) for kind in lists}
    keys.update(("resource", uri) for uri in uris)
    return keys


class _StreamEnded(UpstreamError):
    """The upstream closed the notification stream (gracefully or not); it is opened again."""

    def __init__(self) -> None:
        super().__init__("upstream", "the notification stream ended")

    @property
    def is_transport_failure(self) -> bool:
        return False


def _honoured(ack: JsonObject) -> JsonObject:
    params = ack.get("params")
    notifications = params.get("notifications") if isinstance(params, dict) else None
    if ack.get("method") != "notifications/subscriptions/acknowledged" or not isinstance(notifications, dict):
        return {}
    return notifications


def _unsupported(exc: UpstreamError) -> bool:
    # No GET stream (405), or no listen (-32601 / 404): the upstream cannot push; ask once, not forever.
    if isinstance(exc, UpstreamHTTPError):
        return exc.status in (404, 405)
    return isinstance(exc, UpstreamRpcError) and exc.code == -32601
