"""The rules of the upstream's own notification streams (see `sidecar.watch.native`), with no I/O: one stream per
authorization context up to `max_native_streams`, what each asks the upstream for and when, what it covers and
hints, how it backs off when it breaks, and when the upstream is taken to serve none.

`NativeRules.handle(event, now)` returns the commands the event asks for (`sidecar.watch.native_events`); it never
awaits, sleeps or touches a metric. `NativeNotifications` carries out the effects and each stream's driver
(`NativeStream`) its steps, feeding back what each came to.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sidecar.backoff import Backoff
from sidecar.changes import WatchKey, WatchKind
from sidecar.config import PollingConfig
from sidecar.identity import PUBLIC, Identity
from sidecar.protocol.types import JsonObject
from sidecar.watch.native_events import (
    Acknowledged,
    Began,
    Command,
    CoverKey,
    Debounce,
    Debounced,
    Dropped,
    Event,
    Finish,
    Heard,
    Held,
    HintKey,
    HintWatching,
    LimitHit,
    Listen,
    Log,
    OpenSession,
    Probe,
    Probed,
    Received,
    Retry,
    RetryDue,
    SessionOpened,
    Start,
    Stop,
    Stopped,
    StreamCrashed,
    StreamEnded,
    StreamFailed,
    StreamsOpen,
    Subscribe,
    SubscribeAnswered,
    Unsolicited,
    Unsubscribe,
    Unsubscribed,
    Wait,
    Wake,
    Woken,
)
from sidecar.watch.native_messages import (
    FILTER_FIELDS,
    Key,
    capability,
    honoured,
    listen_filter,
    named_change,
    unsupported,
)

__all__ = ["ACK_TIMEOUT_S", "REFILTER_DEBOUNCE_S", "RETRY", "NativeRules"]

REFILTER_DEBOUNCE_S = 0.05
"""A burst of new subscriptions becomes one new upstream listen, not one each."""
RETRY = Backoff(0.5, 30.0, jitter=0.5)
"""Backoff between attempts to reopen a broken stream: from half a second to half a minute, each wait between half
and one and a half times its step."""
STEADY_S = RETRY.maximum
"""A stream up this long that breaks starts a new streak of failures (backoff from the start, logged again); one
that breaks sooner (an upstream or proxy that acknowledges, then closes) goes on with its streak's backoff."""
ACK_TIMEOUT_S = 10.0
FAILED = "upstream notification stream failed"
UNSUPPORTED = "the upstream serves no notification stream; polling only"
ENDED = "the notification stream ended"


@dataclass(eq=False)
class _Stream:
    """One context's stream: what the context holds, what the upstream covers, and where its driver is."""

    id: int
    identity: Identity
    uris: dict[str, int] = field(default_factory=dict)
    lists: dict[WatchKind, int] = field(default_factory=dict)
    covered: frozenset[Key] = frozenset()
    opened_at: float | None = None
    """When the stream open now was opened; None while none is."""
    failures: int = 0
    changed: bool = False
    """What the context holds changed since the stream last asked the upstream for it."""
    modern: bool = False
    capabilities: JsonObject = field(default_factory=dict)
    subscribed: set[str] = field(default_factory=set)
    to_subscribe: list[str] = field(default_factory=list)
    to_unsubscribe: list[str] | None = None
    """None until every subscription of the round is answered."""

    @property
    def context(self) -> str:
        return self.identity.context

    @property
    def wanted(self) -> bool:
        return bool(self.uris or self.lists)

    def covers(self, kind: WatchKind, uri: str | None) -> bool:
        return (kind, uri if kind == "resource" else None) in self.covered


class NativeRules:
    """Every context's stream and what the upstream covers; `handle` one event, get its commands."""

    def __init__(self, config: PollingConfig) -> None:
        self._enabled = config.native_notifications
        self._most = config.max_native_streams
        self._table: dict[str, _Stream] = {}
        """The stream of each context that holds a key now."""
        self._running: dict[int, _Stream] = {}
        """Every stream whose task runs, dropped ones still closing included."""
        self._next = 1
        self.unsupported = False
        """The upstream refused its notification stream once: it cannot push, so no stream is opened again."""

    def covers(self, kind: WatchKind, uri: str | None, context: str) -> bool:
        """Whether the upstream's notifications cover this key now (for a public key: any context's)."""
        stream = self._table.get(context)
        if stream is not None:
            return stream.covers(kind, uri)
        return context == PUBLIC and any(stream.covers(kind, uri) for stream in self._table.values())

    def streams(self) -> int:
        """Streams whose task runs (each keeps its context's credential)."""
        return len(self._running)

    def contexts(self) -> list[str]:
        """The contexts a stream is kept for now (each keeps that context's credential)."""
        return list(self._table)

    def clear(self) -> None:
        """Shutdown: no context holds a stream any more (their tasks are being closed)."""
        self._table.clear()

    def handle(self, event: Event, now: float) -> list[Command]:
        if isinstance(event, Held):
            return self._held(event)
        if isinstance(event, Dropped):
            return self._dropped(event)
        if isinstance(event, Unsolicited):
            return self._unsolicited(event)
        stream = self._running.get(event.stream)
        if stream is None:
            return []  # a stream already let go of
        if isinstance(event, Heard):
            return self._heard(stream, event.message)
        if isinstance(event, Stopped):
            commands = self._closed(stream)
            del self._running[stream.id]
            if self.unsupported and self._table.get(stream.context) is stream:
                del self._table[stream.context]  # no stream is opened again: none keeps its credential
            return commands
        return self._step(stream, event, now)

    # -- the table ------------------------------------------------------------------------------------------

    def _can_push(self, kind: WatchKind, capabilities: JsonObject) -> bool:
        if not self._enabled or self.unsupported:
            return False
        if kind == "resource":
            return capability(capabilities, "resources", "subscribe")
        return capability(capabilities, FILTER_FIELDS[kind][1], "listChanged")

    def _held(self, event: Held) -> list[Command]:
        if not self._can_push(event.kind, event.capabilities):
            return []
        context = event.identity.context
        stream = self._table.get(context)
        commands: list[Command] = []
        if stream is None:
            if len(self._table) >= self._most:
                return [LimitHit()]
            stream = self._table[context] = self._running[self._next] = _Stream(self._next, event.identity)
            self._next += 1
            commands.append(Start(stream.id, event.identity))
        elif stream.id not in self._running:
            # Its task ended while the context holds keys (only a bug outside its steps ends it so): started again.
            self._running[stream.id] = stream
            stream.failures = 0
            commands.append(Start(stream.id, stream.identity))
        else:
            commands.append(Wake(stream.id))
        if event.kind == "resource" and event.uri is not None:
            stream.uris[event.uri] = stream.uris.get(event.uri, 0) + 1
        else:
            stream.lists[event.kind] = stream.lists.get(event.kind, 0) + 1
        stream.changed = True
        return commands

    def _dropped(self, event: Dropped) -> list[Command]:
        stream = self._table.get(event.context)
        if stream is None:
            return []
        counts: dict[str, int] | dict[WatchKind, int] = stream.uris if event.kind == "resource" else stream.lists
        item = event.uri if event.kind == "resource" else event.kind
        if item not in counts:
            return []
        counts[item] -= 1  # type: ignore[index]
        if counts[item] > 0:  # type: ignore[index]
            return []
        del counts[item]  # type: ignore[arg-type]
        stream.changed = True
        if stream.wanted:
            return [Wake(stream.id)]
        # Out of the table now, not when the task has finished: a hold before then gets a stream of its own
        # instead of one whose task is ending.
        del self._table[event.context]
        return [Stop(stream.id)]

    def _unsolicited(self, event: Unsolicited) -> list[Command]:
        """A notification a child process sent on its own, declared or not: a hint for every context's watch of it
        (the one child serves them all). A 2025-11-25 stream open on it hears the same message and hints already."""
        named = named_change(event.message)
        if named is None:
            return []  # a log message, progress of nobody's request: not about a watch
        method, kind, uri = named
        if not event.modern and any(stream.opened_at is not None for stream in self._table.values()):
            return []
        return [Received(method), HintWatching(kind, uri)]

    # -- one stream -----------------------------------------------------------------------------------------

    def _heard(self, stream: _Stream, message: JsonObject) -> list[Command]:
        named = named_change(message)
        if named is None:
            return []
        method, kind, uri = named
        return [Received(method), *self._hint(kind, uri, stream.context, warm=True)]

    def _step(self, stream: _Stream, event: Event, now: float) -> list[Command]:
        if isinstance(event, Began | RetryDue):
            # The era and capabilities first: after an outage they are probed afresh, and a stream opened before
            # would take a 2026-07-28 upstream for a 2025-11-25 one, or subscribe to nothing.
            return [Probe(stream.id)] if stream.wanted else [Finish(stream.id)]
        if isinstance(event, Probed):
            stream.modern, stream.capabilities = event.modern, event.capabilities
            if not stream.wanted:
                return self._ended_well(stream)
            return self._listen(stream) if event.modern else [OpenSession(stream.id)]
        if isinstance(event, Acknowledged):
            commands = self._opened(stream, now)
            return commands + self._cover(stream, honoured(event.ack), hint_new=True) + self._wait(stream)
        if isinstance(event, SessionOpened):
            stream.subscribed = set()
            return self._opened(stream, now) + self._subscribe(stream)
        if isinstance(event, SubscribeAnswered):
            if event.ok:
                stream.subscribed.add(event.uri)
            return self._next_subscription(stream)
        if isinstance(event, Unsubscribed):
            return self._next_subscription(stream)
        if isinstance(event, Woken):
            return self._wait(stream)
        if isinstance(event, Debounced):
            if not stream.wanted:
                return self._ended_well(stream)
            if stream.modern:
                stream.capabilities = event.capabilities
                return self._listen(stream)
            return self._subscribe(stream)
        if isinstance(event, StreamEnded | StreamFailed | StreamCrashed):
            return self._failed(stream, event, now)
        raise AssertionError(f"not a stream's event: {event!r}")

    def _listen(self, stream: _Stream) -> list[Command]:
        """2026-07-28: a listen with the context's filter; the driver opens the new one before the old one closes,
        so no notification falls between the two."""
        stream.changed = False
        wanted = listen_filter(stream.uris, stream.lists, stream.capabilities)
        if not wanted:
            return self._ended_well(stream)
        return [Listen(stream.id, wanted)]

    def _subscribe(self, stream: _Stream) -> list[Command]:
        """2025-11-25: the URIs not yet subscribed to on the context's session, one by one, then those let go of."""
        stream.changed = False
        subscribe = capability(stream.capabilities, "resources", "subscribe")
        stream.to_subscribe = sorted(set(stream.uris) - stream.subscribed) if subscribe else []
        stream.to_unsubscribe = None
        return self._next_subscription(stream)

    def _next_subscription(self, stream: _Stream) -> list[Command]:
        if stream.to_subscribe:
            return [Subscribe(stream.id, stream.to_subscribe.pop(0))]
        if stream.to_unsubscribe is None:
            # Once every subscription is answered: those let go of meanwhile are let go of too.
            stream.to_unsubscribe = sorted(stream.subscribed - set(stream.uris))
            stream.subscribed -= set(stream.to_unsubscribe)
        if stream.to_unsubscribe:
            return [Unsubscribe(stream.id, stream.to_unsubscribe.pop(0))]
        capabilities = stream.capabilities
        lists: set[Key] = {
            (kind, None) for kind in stream.lists if capability(capabilities, FILTER_FIELDS[kind][1], "listChanged")
        }
        uris: set[Key] = {("resource", uri) for uri in stream.subscribed}
        return self._cover(stream, frozenset(uris | lists), hint_new=True) + self._wait(stream)

    def _wait(self, stream: _Stream) -> list[Command]:
        if stream.changed:
            return [Debounce(stream.id, REFILTER_DEBOUNCE_S)]
        return [Wait(stream.id)]

    def _opened(self, stream: _Stream, now: float) -> list[Command]:
        if stream.opened_at is not None:
            return []
        stream.opened_at = now
        return [StreamsOpen(1)]

    def _closed(self, stream: _Stream) -> list[Command]:
        commands: list[Command] = []
        if stream.opened_at is not None:
            stream.opened_at = None
            commands.append(StreamsOpen(-1))
        return commands + self._cover(stream, frozenset(), hint_new=False)  # now and at their usual pace

    def _ended_well(self, stream: _Stream) -> list[Command]:
        """Nothing left to ask the upstream for: the stream closes, and is tried again while the context holds
        anything."""
        stream.failures = 0
        commands = self._closed(stream)
        return [*commands, Retry(stream.id, RETRY.delay(0))] if stream.wanted else [*commands, Finish(stream.id)]

    def _failed(self, stream: _Stream, event: StreamEnded | StreamFailed | StreamCrashed, now: float) -> list[Command]:
        steady = stream.opened_at is not None and now - stream.opened_at >= STEADY_S
        stream.failures = 1 if steady else stream.failures + 1
        commands: list[Command] = []
        if not isinstance(event, StreamCrashed):  # a crash was logged, with its traceback, where it was caught
            reason = ENDED if isinstance(event, StreamEnded) else event.error.reason
            if stream.failures == 1:
                commands.append(Log(FAILED, reason))
            if isinstance(event, StreamFailed) and unsupported(event.error):
                commands.append(Log(UNSUPPORTED, reason))
                self.unsupported = True
                return [*commands, *self._closed(stream), Finish(stream.id)]
        commands += self._closed(stream)
        if not stream.wanted:
            return [*commands, Finish(stream.id)]
        return [*commands, Retry(stream.id, RETRY.delay(stream.failures))]

    def _cover(self, stream: _Stream, covered: frozenset[Key], *, hint_new: bool) -> list[Command]:
        """Record what the upstream covers now; keys newly covered are polled once (a change between their first
        read and the upstream's ack would otherwise wait for the backstop)."""
        before, stream.covered = stream.covered, covered
        commands: list[Command] = []
        for kind, uri in sorted(covered ^ before, key=_order):
            for watched in (PUBLIC, stream.context):
                commands.append(CoverKey(WatchKey(kind, uri, watched), self.covers(kind, uri, watched)))
        if hint_new:
            for kind, uri in sorted(covered - before, key=_order):
                commands += self._hint(kind, uri, stream.context, warm=False)
        return commands

    @staticmethod
    def _hint(kind: WatchKind, uri: str | None, context: str, *, warm: bool) -> list[Command]:
        """(kind, uri) may have changed as `context` sees it: its own watch, and the public one, look. `warm`: the
        upstream said so (its notification), not just that it covers the key now."""
        return [HintKey(WatchKey(kind, uri, watched), warm) for watched in (PUBLIC, context)]


def _order(key: Key) -> tuple[str, str]:
    return key[0], key[1] or ""
