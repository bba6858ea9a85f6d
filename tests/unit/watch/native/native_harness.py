"""The bench for the upstream's own notifications (`sidecar.watch.native`): an upstream that can push, watches
that record their hints, and a clock moved by hand, each of which tells the bench when something happened.

Nothing here looks at asyncio's internals. A test waits for what it expects to see with `Bench.until`, which
checks its condition again each time one of the fakes reports a change (a stream opened or closed, a call, a
hint, a key covered, a gauge moved, a timer armed) and fails after a bounded wait. Time moves only by
`ManualClock.advance`, which fires the timers that came due and returns; what they woke runs when the test next
awaits, so a test first waits until the timer it means to fire is armed (`Bench.timer_at`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from sidecar.changes import WatchKey, WatchKind
from sidecar.config import PollingConfig
from sidecar.identity import PUBLIC, Identity
from sidecar.observability.metrics import Metrics
from sidecar.protocol.errors import UpstreamRpcError, UpstreamUnavailable
from sidecar.protocol.types import JsonObject
from sidecar.upstream.answers import UpstreamInfo
from sidecar.upstream.base import Upstream
from sidecar.watch.native import NativeNotifications
from sidecar.watch.native_events import Event, Step
from tests.kit import ACK
from tests.unit.watch.manual_clock import ManualClock
from tests.unit.watch.scripted_upstream import URL, ScriptedUpstream

__all__ = [
    "ALICE",
    "BOB",
    "CONFIG",
    "DEBOUNCE_S",
    "DOC",
    "EVERYTHING",
    "OTHER",
    "Bench",
    "FixedJitter",
    "HeardWatch",
    "Opened",
    "PushingUpstream",
    "Signal",
    "acknowledge_all",
    "ended",
    "make_bench",
    "stream_tasks",
    "warnings_of",
]

EVERYTHING = {
    "resources": {"subscribe": True, "listChanged": True},
    "tools": {"listChanged": True},
    "prompts": {"listChanged": True},
}
CONFIG = PollingConfig(max_native_streams=2)
ALICE = Identity("alice", (("authorization", "Bearer a"),), client="alice-laptop")
BOB = Identity("bob", (("authorization", "Bearer b"),), client="bob-laptop")
DOC = "file:///doc"
OTHER = "file:///other"
DEBOUNCE_S = 0.05
"""The pause after a change of what a context watches before its stream is asked for again."""
IN_PROCESS_WAIT_S = 5.0
"""The longest a test waits for what it expects (it comes in a few turns of the loop when all is well); below
the kit's WAIT_S, nothing here crosses a socket."""


class Signal:
    """Something changed that a waiting test may be waiting for: an event set by the fakes, cleared by `until`."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def __call__(self) -> None:
        self._event.set()

    async def until(self, condition: Callable[[], bool], within_s: float = IN_PROCESS_WAIT_S) -> None:
        """Return once `condition()` holds, checking it again after each change; fail after `within_s`."""
        async with asyncio.timeout(within_s):
            while True:
                self._event.clear()  # before the check: a change while checking is not missed
                if condition():
                    return
                await self._event.wait()


@dataclass
class Opened:
    """One notification stream the upstream opened: for whom, what was asked, and the test's hold on it."""

    identity: Identity
    wanted: JsonObject
    changed: Signal
    queue: asyncio.Queue[JsonObject | BaseException | None] = field(default_factory=asyncio.Queue)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    taken: int = 0
    """Messages the sidecar has read off the stream."""

    def push(self, method: str, params: Any = None) -> None:
        self.queue.put_nowait({"method": method, "params": params} if params is not None else {"method": method})

    def end(self) -> None:
        """The upstream closes the stream."""
        self.queue.put_nowait(None)

    def fail(self, exc: BaseException) -> None:
        self.queue.put_nowait(exc)

    def close(self) -> None:
        self.closed.set()
        self.changed()

    def all_taken(self) -> bool:
        """The sidecar has read everything the test put on the stream (and acted on it: hints are synchronous)."""
        return self.queue.empty() and self.taken > 0


def acknowledge_all(wanted: JsonObject) -> JsonObject:
    return {"method": ACK, "params": {"notifications": wanted}}


class PushingUpstream(ScriptedUpstream):
    """The scripted upstream with notification streams the test opens, feeds, ends and refuses; every stream
    opened or closed and every call is a change."""

    def __init__(self, changed: Signal, era: str = "legacy", capabilities: JsonObject | None = None) -> None:
        super().__init__()
        self.changed = changed
        self.info = UpstreamInfo(era, EVERYTHING if capabilities is None else capabilities, None, None)  # type: ignore[arg-type]
        self.opened: list[Opened] = []
        self.refusals: list[BaseException] = []
        """What the next attempts to open a stream raise, in order."""
        self.attempts = 0
        self.probed_as: list[Identity] = []
        """Whom each look at the era and capabilities was made as (a protected upstream refuses an anonymous one)."""
        """Attempts to open a stream, refused ones included."""
        self.closing_gate: asyncio.Event | None = None
        """While set and not yet open, closing a stream waits for it."""
        self.held_closing = 0
        """Streams whose closing waited at `closing_gate`."""
        self.refused_uris: set[str] = set()
        """URIs `resources/subscribe` refuses."""
        self.learns: UpstreamInfo | None = None
        """What the next probe learns while `info` is None (after an outage the era is probed afresh)."""
        self.honour: Callable[[JsonObject], Any] = acknowledge_all
        """A 2026-07-28 listen's first message, from its filter (`None`: the upstream sends none)."""
        self.listeners: list[Callable[[JsonObject], None]] = []
        """Who hears what it sends on its own, as a stdio child's stdout carries it (a `NotificationSource`)."""

    def add_notification_listener(self, listener: Callable[[JsonObject], None]) -> Callable[[], None]:
        self.listeners.append(listener)
        return lambda: self.listeners.remove(listener) if listener in self.listeners else None

    def send(self, method: str, params: JsonObject | None = None) -> None:
        """A notification on its own, outside any stream the sidecar opened (a stdio child's stdout)."""
        for listener in list(self.listeners):
            listener({"method": method, "params": params} if params is not None else {"method": method})

    async def ensure_info(self, identity: Identity) -> UpstreamInfo:
        """The era and capabilities; while unknown, a probe learns `learns` (or finds the upstream unreachable)."""
        self.probed_as.append(identity)
        if self.info is None and self.learns is not None:
            self.info, self.learns = self.learns, None
            self.changed()
        if self.info is None:
            raise UpstreamUnavailable(URL, "connection refused")
        info: UpstreamInfo = self.info
        return info

    async def call(self, method: str, params: JsonObject, identity: Identity) -> JsonObject:
        try:
            if method == "resources/subscribe" and params.get("uri") in self.refused_uris:
                self.calls.append((method, params["uri"], identity.context))
                raise UpstreamRpcError(URL, {"code": -32602, "message": "no such resource"})
            return await super().call(method, params, identity)
        finally:
            self.changed()

    @property
    def open(self) -> list[Opened]:
        return [opened for opened in self.opened if not opened.closed.is_set()]

    @contextlib.asynccontextmanager
    async def open_notifications(
        self, identity: Identity, wanted: JsonObject
    ) -> AsyncIterator[AsyncIterator[JsonObject]]:
        self.attempts += 1
        self.changed()
        if self.refusals:
            raise self.refusals.pop(0)
        opened = Opened(identity, dict(wanted), self.changed)
        self.opened.append(opened)
        if self.info.era == "modern":
            ack = self.honour(opened.wanted)
            if ack is not None:
                opened.queue.put_nowait(ack)

        async def messages() -> AsyncIterator[JsonObject]:
            while True:
                item = await opened.queue.get()
                opened.taken += 1
                self.changed()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item

        try:
            yield messages()
        finally:
            try:
                if self.closing_gate is not None:
                    self.held_closing += 1
                    self.changed()
                    await self.closing_gate.wait()  # a stream slow to close (its connection lingers)
            finally:
                opened.close()


class HeardWatch:
    """A watch as the notifications see it: the hints it got and whether they cover it."""

    def __init__(self, key: WatchKey, changed: Signal) -> None:
        self.key = key
        self.native = False
        self.hints = 0
        self.warm_hints = 0
        """Hints that keep the watch warm: the upstream's notifications (a newly covered key's look is not one)."""
        self._changed = changed

    def hint(self, *, warm: bool = False) -> None:
        self.hints += 1
        self.warm_hints += warm
        self._changed()

    def set_native(self, native: bool) -> None:
        self.native = native
        self._changed()


class FixedJitter:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


class _ReportingNotifications(NativeNotifications):
    """The real NativeNotifications, reporting each event its rules handled (a gauge moved, a key covered, the
    upstream found to serve no stream) as a change."""

    def __init__(self, changed: Signal, *args: Any, **kwargs: Any) -> None:
        self._changed = changed
        super().__init__(*args, **kwargs)

    def handle(self, event: Event) -> Step | None:
        step = super().handle(event)
        self._changed()
        return step


@dataclass
class Bench:
    changed: Signal
    clock: ManualClock
    upstream: PushingUpstream
    metrics: Metrics
    native: NativeNotifications
    watches: dict[WatchKey, HeardWatch] = field(default_factory=dict)

    def watch(self, kind: WatchKind, uri: str | None, identity: Identity, *, public: bool = False) -> HeardWatch:
        """What the registry does for a stream's new interest: the watch (new or not) and the context's hold."""
        key = WatchKey(kind, uri, PUBLIC if public else identity.context)
        watch = self.watches.get(key)
        if watch is None:
            watch = self.watches[key] = HeardWatch(key, self.changed)
            self.native.update(key)
        self.native.hold(identity, kind, uri)
        return watch

    async def until(self, condition: Callable[[], bool], within_s: float = IN_PROCESS_WAIT_S) -> None:
        await self.changed.until(condition, within_s)

    async def timer_at(self, when: float) -> None:
        """Wait until a timer due at `when` is armed (the code under test is waiting on the clock for it)."""
        await self.until(lambda: any(abs(due - when) < 1e-6 for due in self.clock.due()))

    async def idle_after(self, opened: Opened) -> None:
        """Wait until the sidecar has read all the test put on `opened` (what it heard is acted on at once)."""
        await self.until(opened.all_taken)

    def hints(self) -> dict[WatchKey, int]:
        return {key: watch.hints for key, watch in self.watches.items() if watch.hints}

    def covered(self) -> set[WatchKey]:
        return {key for key, watch in self.watches.items() if watch.native}

    def gauge(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)

    def hint(self, key: WatchKey, *, warm: bool = False) -> None:
        """What the registry does with a hint: the key's watch, if there is one, looks soon."""
        if (watch := self.watches.get(key)) is not None:
            watch.hint(warm=warm)

    def cover(self, key: WatchKey, native: bool) -> None:
        """What the registry does with a key's coverage: its watch, if there is one, polls as it says."""
        if (watch := self.watches.get(key)) is not None and watch.native != native:
            watch.set_native(native)

    def clear_hints(self) -> None:
        for watch in self.watches.values():
            watch.hints = 0


def stream_tasks() -> set[asyncio.Task[Any]]:
    """The notification streams' tasks still running (each keeps its context's credential)."""
    return {
        task for task in asyncio.all_tasks() if not task.done() and "NativeNotifications._run" in repr(task.get_coro())
    }


async def ended(tasks: set[asyncio.Task[Any]]) -> None:
    """Wait until each of `tasks` has finished (and the callbacks that let go of it have run)."""
    if tasks:
        await asyncio.wait(tasks, timeout=IN_PROCESS_WAIT_S)
        assert all(task.done() for task in tasks), "a stream's task did not end"


def make_bench(era: str = "legacy", capabilities: JsonObject | None = None, config: PollingConfig = CONFIG) -> Bench:
    changed = Signal()
    clock = ManualClock(changed)
    upstream = PushingUpstream(changed, era, capabilities)
    metrics = Metrics()
    bench = Bench(changed, clock, upstream, metrics, cast(NativeNotifications, None))
    bench.native = _ReportingNotifications(
        changed,
        cast(Upstream, upstream),
        config,
        metrics,
        hint=bench.hint,
        cover=bench.cover,
        keys_at=lambda kind, uri: [key for key in bench.watches if key.kind == kind and key.uri == uri],
        clock=clock,
    )
    return bench


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What was logged as a warning or worse."""
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
