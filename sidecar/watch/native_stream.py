"""One authorization context's stream of the upstream's own notifications (see `sidecar.watch.native`): the task
that carries out the steps its rules (`sidecar.watch.native_rules`) ask for, one at a time, and tells them what
each came to. What is open upstream (the listens, the session stream, their readers) lives here, and is closed
here, whatever ends the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

from sidecar.identity import Identity
from sidecar.protocol.errors import UpstreamError, UpstreamRpcError
from sidecar.protocol.types import JsonObject
from sidecar.upstream.base import OpenNotifications
from sidecar.watch.clock import Clock, sleep, within
from sidecar.watch.native_events import (
    Acknowledged,
    Began,
    Debounce,
    Debounced,
    Event,
    Finish,
    Heard,
    Listen,
    OpenSession,
    Probe,
    Probed,
    Retry,
    RetryDue,
    SessionOpened,
    Step,
    Stopped,
    StreamCrashed,
    StreamEnded,
    StreamFailed,
    Subscribe,
    SubscribeAnswered,
    Unsubscribe,
    Unsubscribed,
    Wait,
    Woken,
)
from sidecar.watch.native_rules import ACK_TIMEOUT_S

__all__ = ["NativeStream", "StreamOwner"]

logger = logging.getLogger("sidecar.watch.native")  # the feature's name, which its log lines are filtered by

_Opened = tuple[contextlib.AsyncExitStack, "asyncio.Task[None] | None"]
"""A stream open upstream: what closes it, and the task reading it (None until it is read)."""


class StreamOwner(Protocol):
    """What a stream needs of the streams' owner (`NativeNotifications`): the upstream and its clock, and the rules
    that hear what each step came to (their effects carried out) and say the next."""

    upstream: OpenNotifications
    clock: Clock

    @property
    def capabilities(self) -> JsonObject: ...

    @property
    def modern(self) -> bool: ...

    def handle(self, event: Event) -> Step | None: ...


class NativeStream:
    """One context's stream of upstream notifications: its task's steps, and what it has open upstream."""

    def __init__(self, owner: StreamOwner, stream: int, identity: Identity) -> None:
        self.owner = owner
        self.id = stream
        self.identity = identity
        self.changed = asyncio.Event()
        """Set by the rules' `Wake`: what the context holds changed."""
        self._open: list[_Opened] = []
        """What is open upstream, oldest first: a new listen is kept here before the old one closes, so that a
        cancellation while the old one closes closes the new one too."""

    async def run(self) -> None:
        try:
            step = self.owner.handle(Began(self.id))
            while step is not None and not isinstance(step, Finish):
                step = self.owner.handle(await self._attempt(step))
        finally:
            await self._close_all()
            self.owner.handle(Stopped(self.id))

    async def _attempt(self, step: Step) -> Event:
        """What `step` came to; a failure closes everything open first (a failure to close counts as one too)."""
        try:
            try:
                return await self._perform(step)
            except BaseException:
                await self._close_all()
                raise
        except _Ended:
            return StreamEnded(self.id)
        except UpstreamError as exc:
            return StreamFailed(self.id, exc)
        except Exception:  # boundary: a bug here must leave polling working, never stop it
            logger.exception("upstream notification stream crashed")
            return StreamCrashed(self.id)

    async def _perform(self, step: Step) -> Event:
        upstream = self.owner.upstream
        if isinstance(step, Probe):
            await upstream.ensure_info(self.identity)
            return Probed(self.id, self.owner.modern, self.owner.capabilities)
        if isinstance(step, Listen):
            return await self._listen(step.wanted)
        if isinstance(step, OpenSession):
            messages = await self._open_stream({})
            self._open[-1] = (self._open[-1][0], self._reader(messages))
            return SessionOpened(self.id)
        if isinstance(step, Subscribe):
            try:
                await upstream.call("resources/subscribe", {"uri": step.uri}, self.identity)
            except UpstreamRpcError:
                return SubscribeAnswered(self.id, step.uri, ok=False)  # refused for this URI: it stays polled
            return SubscribeAnswered(self.id, step.uri, ok=True)
        if isinstance(step, Unsubscribe):
            with contextlib.suppress(UpstreamError):
                await upstream.call("resources/unsubscribe", {"uri": step.uri}, self.identity)
            return Unsubscribed(self.id, step.uri)
        if isinstance(step, Wait):
            await self._until_changed_or_ended()
            return Woken(self.id)
        if isinstance(step, Debounce):
            await sleep(self.owner.clock, step.seconds)
            return Debounced(self.id, self.owner.capabilities)
        if isinstance(step, Retry):
            await self._close_all()
            await sleep(self.owner.clock, step.seconds)
            return RetryDue(self.id)
        raise AssertionError(f"not a step: {step!r}")

    async def _listen(self, wanted: JsonObject) -> Event:
        """2026-07-28: a new listen, acknowledged before the one it replaces closes (no notification falls between
        the two)."""
        messages = await self._open_stream(wanted)
        ack = await self._acknowledgment(messages)
        self._open[-1] = (self._open[-1][0], self._reader(messages))
        while len(self._open) > 1:
            await _close(self._open.pop(0))
        return Acknowledged(self.id, ack)

    async def _open_stream(self, wanted: JsonObject) -> Any:
        """Open a stream with filter `wanted`, kept in `_open` at once (a cancellation from then on closes it)."""
        stack = contextlib.AsyncExitStack()
        try:
            messages = await stack.enter_async_context(self.owner.upstream.open_notifications(self.identity, wanted))
        except BaseException:
            await stack.aclose()
            raise
        self._open.append((stack, None))  # read once its acknowledgment, if one comes first, is taken
        return messages

    def _reader(self, messages: Any) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self._read(messages))

    async def _acknowledgment(self, messages: Any) -> JsonObject:
        try:
            ack: JsonObject = await within(self.owner.clock, ACK_TIMEOUT_S, anext(messages))
        except StopAsyncIteration:
            raise _Ended from None
        except TimeoutError:
            raise UpstreamError(self.owner.upstream.url, f"no acknowledgment within {ACK_TIMEOUT_S:g} s") from None
        return ack

    async def _until_changed_or_ended(self) -> None:
        reader = self._open[-1][1]
        assert reader is not None, "a wait follows an open stream's first message"
        changed = asyncio.get_running_loop().create_task(self.changed.wait())
        try:
            await asyncio.wait({changed, reader}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
        if reader.done():
            reader.result()  # the stream's failure, if it failed
            raise _Ended
        self.changed.clear()  # the rules know what changed; a later change wakes the next wait

    async def _read(self, messages: Any) -> None:
        async with contextlib.aclosing(messages):
            async for message in messages:
                self.owner.handle(Heard(self.id, message))

    async def _close_all(self) -> None:
        while self._open:
            await _close(self._open.pop())


async def _close(opened: _Opened) -> None:
    stack, reader = opened
    if reader is not None:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    await stack.aclose()


class _Ended(Exception):
    """The upstream closed the notification stream (gracefully or not); it is opened again."""
