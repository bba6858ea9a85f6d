"""The engine's polls driven with no event loop: its timers armed on a hand-moved clock, and each poll it asks for
answered by the test in the same step (or held open until the test answers it).

The registry's part (run each `StartPoll`, feed back `PollDone`/`PollFailed`, or `PollSkipped` for a watch nobody
holds, then `PollFinished`; arm each `SetTimer`) reduced to what a playbook of one watch's polls needs: the test
says what each look sees, and reads back when the polls started, which were hinted, and what was applied,
published and waited for.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final

from sidecar.changes import WatchKey, WatchKind
from sidecar.identity import Identity
from sidecar.protocol.errors import UpstreamError
from sidecar.watch.clock import Timer
from sidecar.watch.engine import Engine, Record
from sidecar.watch.engine.commands import (
    AnnounceWrites,
    CancelTimer,
    Command,
    LinkPoll,
    Observed,
    Publish,
    SetTimer,
    StartLook,
    StartPoll,
    Waited,
)
from sidecar.watch.engine.events import (
    Event,
    LookDone,
    PollDone,
    PollFailed,
    PollFinished,
    PollSkipped,
    Published,
    Subscribe,
    TimerFired,
)
from sidecar.watch.observation import Observation
from tests.unit.watch.engine_cast import Book
from tests.unit.watch.manual_clock import ManualClock

__all__ = ["HELD", "Answer", "Polled", "Started"]


class _Held:
    def __repr__(self) -> str:
        return "HELD"


HELD: Final = _Held()
"""What an answer returns for a poll the test holds open (it answers it later with `Polled.finish`)."""

Answer = Callable[[WatchKey, float], Observation | UpstreamError | _Held]
"""What a poll of the key that starts at a time sees: an observation (an error state too), a failure, or HELD."""


@dataclass(frozen=True, slots=True)
class Started:
    """A poll the engine started: when, and whether it was a hinted one."""

    at: float
    hinted: bool


class Polled:
    """An engine on `clock`: its timers fire as the test moves the clock, and each poll looks at once (`answer`)."""

    def __init__(self, engine: Engine, answer: Answer, clock: ManualClock | None = None) -> None:
        self.clock = clock or ManualClock()
        self.play = Book(engine, self.clock.now())
        self.engine = engine
        self._answer = answer
        self._timers: dict[int, Timer] = {}
        self._tickets = itertools.count(1)
        self.polls: list[Started] = []
        self.observed: list[Observed] = []
        self.published: list[Publish] = []
        self.waited: list[Waited] = []
        self.announced: list[frozenset[str]] = []
        """The contexts of each round of writes told to the other replicas (`AnnounceWrites`)."""
        self.linked: list[LinkPoll] = []
        self.held: dict[WatchKey, float] = {}
        """Polls in flight that the test answers itself, by key: when each started."""

    def feed(self, event: Event) -> list[Command]:
        """`event` happens now (the clock's time): carry out what it asks for, the polls last (as the registry
        starts a task for each, which runs once the step is over)."""
        self.play.at(self.clock.now())
        commands = self.play.feed(event)
        polls: list[StartPoll] = []
        for command in commands:
            if isinstance(command, SetTimer):
                self._timers[command.timer] = self.clock.call_at(
                    command.when, functools.partial(self._fire, command.timer)
                )
            elif isinstance(command, CancelTimer):
                if (armed := self._timers.pop(command.timer, None)) is not None:
                    armed.cancel()
            elif isinstance(command, StartPoll):
                polls.append(command)
            elif isinstance(command, Observed):
                self.observed.append(command)
            elif isinstance(command, Publish):
                self.published.append(command)
            elif isinstance(command, Waited):
                self.waited.append(command)
            elif isinstance(command, AnnounceWrites):
                self.announced.append(command.contexts)
            elif isinstance(command, LinkPoll):
                self.linked.append(command)
        for poll in polls:
            self._poll(poll)
        return commands

    def watch(self, who: Identity, uri: str | None, first: Observation, kind: WatchKind = "resource") -> WatchKey:
        """`who` subscribes to `uri` (or a list `kind`) and its first read sees `first`, now: the new watch it holds
        from then on."""
        before = set(self.engine.keys())
        [look] = [command for command in self.feed(Subscribe(0, kind, uri, who)) if isinstance(command, StartLook)]
        self.feed(LookDone(look.look, next(self._tickets), first))
        self.feed(Published(look.look))
        [key] = [key for key in self.engine.keys() if key not in before]
        return key

    def record(self, key: WatchKey) -> Record:
        record = self.engine.record(key)
        assert record is not None, f"no watch of {key}"
        return record

    def _fire(self, timer: int) -> None:
        if self._timers.pop(timer, None) is not None:
            self.feed(TimerFired(timer))

    def _poll(self, poll: StartPoll) -> None:
        now = self.clock.now()
        if self.engine.poller(poll.key) is None:  # lingering, held by no stream: no credential, so no look
            self.feed(PollSkipped(poll.key, now))
            self.feed(PollFinished(poll.key))
            return
        self.polls.append(Started(now, poll.hinted))
        seen = self._answer(poll.key, now)
        if isinstance(seen, _Held):
            self.held[poll.key] = now
        else:
            self._answered(poll.key, now, seen)

    def finish(self, key: WatchKey, seen: Observation | UpstreamError) -> None:
        """The poll of `key` the test held comes back now, having seen `seen`."""
        self._answered(key, self.held.pop(key), seen)

    def _answered(self, key: WatchKey, started: float, seen: Observation | UpstreamError) -> None:
        if isinstance(seen, Observation):
            self.feed(PollDone(key, started, next(self._tickets), seen))
        else:
            self.feed(PollFailed(key, started))
        self.feed(PollFinished(key))

    def started_at(self) -> list[float]:
        return [poll.at for poll in self.polls]

    def told(self) -> list[str]:
        return [change.fingerprint for change in self.published]


def run_spawned(coro: Coroutine[Any, Any, None]) -> None:
    """Run a spawned coroutine (an announcement to the other replicas) to its end with no loop: the coordinators of
    these tests await nothing, so it never suspends."""
    try:
        coro.send(None)
    except StopIteration:
        return
    coro.close()
    raise AssertionError("a spawned coroutine waited for something")
