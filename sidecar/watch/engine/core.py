"""The watch engine's record and lifecycle as one state machine: `handle(event, now) -> commands`.

Everything the registry decides lives here: which watches exist and where each is in its life (starting,
live, lingering, ended), who holds them (one count, per context), which first reads and joiners' looks callers
share, which contexts proved their access to a public watch, which resources were just found missing, and how
fast each client may start first reads at once. It never awaits: time comes with each event, and every effect
goes out as a command (`sidecar.watch.engine.commands`) that the driver (`sidecar.watch.registry`) carries out,
feeding back what came of it. Nothing can happen between two of its steps, so no stage guards a race.

Guarantees (the registry's, stated where they are kept):
- Coalescing: concurrent first interests share one first read per (kind, URI, context), and joiners of a live
  watch one look per key; a read paced in its client's fair share is that client's alone (invariant 20).
- Baseline first: a caller is answered only once the watch has a fingerprint (invariant 6); a joiner only once a
  look that started after it asked is applied (invariant 16).
- Private stays private: a result that is not `public` is watched per context, and polled with a credential of
  a context that holds it (invariant 10).
- The last holder's release starts a linger; a caller that leaves before its answer is dropped from its look.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterator

from sidecar.backoff import JITTER
from sidecar.changes import WatchKey, WatchKind
from sidecar.config import PollingConfig
from sidecar.identity import PUBLIC, Identity
from sidecar.watch.admission import Admission
from sidecar.watch.engine.commands import (
    CancelTimer,
    Command,
    Cover,
    Fail,
    PublishFirst,
    Resolve,
    SetTimer,
    StartLook,
    StartWatch,
    StopWatch,
    Track,
    Uncover,
    Untrack,
)
from sidecar.watch.engine.events import (
    ChangeHeard,
    Event,
    Forwarded,
    Leave,
    LookDone,
    LookFailed,
    PollFailed,
    Published,
    Recovered,
    Refused,
    Release,
    Subscribe,
    TimerFired,
    WritesHeard,
    Wrote,
)
from sidecar.watch.engine.evidence import Evidence
from sidecar.watch.engine.index import WatchIndex
from sidecar.watch.engine.record import Pending, Record, Share, Stage
from sidecar.watch.engine.watching import Watching
from sidecar.watch.engine.writes import WriteRounds
from sidecar.watch.observation import Observation
from sidecar.watch.rules import Rules

__all__ = ["Engine"]

_DEFAULTS = PollingConfig()


class Engine:
    """The registry's state machine: feed it events with the time they happened, carry out what it returns."""

    def __init__(
        self,
        *,
        linger_s: float,
        absent_ttl_s: float,
        rate_per_s: float,
        rules: Rules,
        polling: PollingConfig = _DEFAULTS,
        settle_ms: int = 0,
        rand: Callable[[], float] = JITTER.random,
        may_poll: Callable[[WatchKey], bool] = lambda key: True,
        replicas: Callable[[], int] = lambda: 1,
    ) -> None:
        """`polling`: intervals, backoff, jitter (drawn from `rand`) and the read and hint budgets; `settle_ms`: how
        long a hint keeps a watch warm; `may_poll` and `replicas`: the coordinator's answers (whether this
        replica holds a key's lease, how many replicas share the read budget), read, never written."""
        self._linger_s = linger_s
        self._rules = rules
        self._now = 0.0
        self.admission = Admission(absent_ttl_s=absent_ttl_s, rate_per_s=rate_per_s, clock=lambda: self._now)
        """Known-absent memory and first-read tokens, on the engine's time."""
        self._records: dict[WatchKey, Record] = {}
        self.index = WatchIndex()
        """The records' keys by context and by target, kept with `_records` (read by the driver's collaborators)."""
        self._looks: dict[int, Pending] = {}
        """Looks callers wait on, by the id their StartLook command carries (until answered)."""
        self._shared: dict[Hashable, int] = {}
        """Looks a later caller may share: by what they read, or by what and the client paced for."""
        self._waiting: dict[int, int] = {}
        """Waiter -> the look it waits on."""
        self._timers: dict[int, WatchKey] = {}
        self._ids: Iterator[int] = itertools.count(1)
        self._watching = Watching(
            self._records, self.index, polling, settle_ms=settle_ms, rand=rand, may_poll=may_poll, replicas=replicas
        )
        self._writes = WriteRounds(
            polling.revalidate_debounce_ms / 1000, lambda: next(self._ids), self.index, self._watching
        )
        self._evidence = Evidence(
            self._records,
            self.admission,
            rules,
            lambda record, observation, ticket: self._watching.apply(record, observation, ticket, self._now),
            lambda context, link: self._writes.wrote(context, link, self._now),
        )

    # -- what the driver may read ---------------------------------------------------------------------------------

    def record(self, key: WatchKey) -> Record | None:
        return self._records.get(key)

    def keys(self) -> list[WatchKey]:
        return list(self._records)

    def records(self) -> list[Record]:
        return list(self._records.values())

    @property
    def looks_in_flight(self) -> int:
        """Looks that callers wait on (or waited on, and that have not come back)."""
        return len(self._looks)

    def poller(self, key: WatchKey) -> Identity | None:
        """The identity a poll of `key` goes with now (`Record.poller`); None for a key not watched."""
        record = self._records.get(key)
        return None if record is None else record.poller

    # -- events ----------------------------------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Command]:
        """What `event`, which happened at `now`, asks for."""
        self._now = now
        commands = self._dispatch(event)
        # The step is over: the watches a read budget's allocation during it shortened are re-armed now, not from
        # inside the allocation (which runs while a plan asks for its interval).
        commands.extend(self._watching.tighten(now))
        return commands

    def _dispatch(self, event: Event) -> list[Command]:
        if isinstance(event, Subscribe):
            return self._subscribe(event)
        if isinstance(event, LookDone):
            return self._look_done(event)
        if isinstance(event, Release):
            return self._release(event.key, event.context)
        if isinstance(event, Leave):
            return self._leave(event.waiter)
        if isinstance(event, Published):
            return self._published(event)
        if isinstance(event, LookFailed):
            return self._look_failed(event)
        if isinstance(event, TimerFired):
            if self._watching.owns_timer(event.timer):
                return self._watching.fired(event.timer, self._now)
            if self._writes.owns_timer(event.timer):
                return self._writes.fired(self._now)
            return self._expire(event.timer)
        if isinstance(event, ChangeHeard):
            if event.event.key.kind == "resources_list" and not event.event.baseline:
                self.admission.present()  # what was missing may exist now
            return self._watching.adopt(event.event, self._now)
        if isinstance(event, Forwarded):
            return self._evidence.forwarded(event)
        if isinstance(event, Wrote | WritesHeard):
            return self._writes.handle(event, self._now)
        if isinstance(event, Refused):
            return self._evidence.refused(event.method, event.params, event.identity)
        if isinstance(event, Recovered):
            return self._watching.recover(self._now)
        if isinstance(event, PollFailed) and event.refused is not None:
            return self._watching.handle(event, self._now) + self._evidence.poll_refused(event.key, event.refused)
        return self._watching.handle(event, self._now)

    def _subscribe(self, event: Subscribe) -> list[Command]:
        identity, kind, uri = event.identity, event.kind, event.uri
        commands: list[Command] = []
        record = self._joinable(kind, uri, identity.context)
        if record is not None:
            # A sync point: the answer waits for a look that starts after the caller asked (shared by everyone
            # joining while it is in flight), so a read after the ack is never older than the subscription
            # (invariant 16). The caller holds the watch from now: a lingering one must not expire meanwhile.
            self._add_holder(record, identity, commands)
            read: Hashable = ("join", record.key)
            joining: WatchKey | None = record.key
        else:
            read = ("first", kind, uri, identity.context)
            joining = None
        look = self._shared.get(read) or self._shared.get((read, identity.client))
        if look is None:
            if joining is None and self.admission.known_absent(kind, uri, identity.context):
                return [Resolve(event.waiter, None)]  # found missing a moment ago: not read again so soon
            look = next(self._ids)
            paced = not self.admission.take(identity.client)
            shared_as = (read, identity.client) if paced else read
            self._looks[look] = Pending(shared_as, kind, uri, identity.context, joining)
            self._shared[shared_as] = look
            commands.append(StartLook(look, kind, uri, identity, paced))
        self._looks[look].waiters[event.waiter] = identity
        self._waiting[event.waiter] = look
        return commands

    def _joinable(self, kind: WatchKind, uri: str | None, context: str) -> Record | None:
        public = self._records.get(WatchKey(kind, uri, PUBLIC))
        if public is not None and context in public.verified:
            return public
        return self._records.get(WatchKey(kind, uri, context))

    def _look_done(self, event: LookDone) -> list[Command]:
        pending = self._looks.get(event.look)
        if pending is None:
            return []
        observation = event.observation
        if pending.joining is not None:
            return self._joined(event.look, pending, observation, event.ticket)
        if not observation.found:
            self.admission.absent(pending.kind, pending.uri, pending.context)
            return [Resolve(waiter, None) for waiter in self._done(event.look)]
        key = WatchKey(pending.kind, pending.uri, PUBLIC if observation.public else pending.context)
        record = self._records.get(key)
        if record is not None:
            commands = self._watching.apply(record, observation, event.ticket, self._now)
            commands.extend(self._answer_first(event.look, record))
            if record.stage is Stage.LINGERING:
                self._linger(record, commands)  # a first read found it: its linger starts again
            return commands
        # A new watch. Other replicas' caches may hold an answer older than this first look (one cached before
        # anyone watched): its callers are answered once it is published, so those drop it before any ack.
        record = self._records[key] = Record(key)
        self.index.add(key)
        pending.key = key
        rule = self._rules.for_uri(key.uri)
        return [
            StartWatch(key, observation, event.ticket),
            *self._watching.start(record, observation, event.ticket, rule.interval_ms if rule else None, self._now),
            PublishFirst(event.look, key, observation.fingerprint),
        ]

    def _published(self, event: Published) -> list[Command]:
        pending = self._looks.get(event.look)
        if pending is None or pending.key is None:
            return []
        record = self._records[pending.key]  # a starting watch never expires
        if event.error is not None:
            commands: list[Command] = [Fail(waiter, event.error) for waiter in self._done(event.look)]
        else:
            commands = self._answer_first(event.look, record)
        if record.stage is Stage.STARTING:
            # Only now may it expire, once the callers waiting on its first look hold it.
            if record.holders > 0:
                record.stage = Stage.LIVE
            else:
                self._linger(record, commands)
        return commands

    def _answer_first(self, look: int, record: Record) -> list[Command]:
        """A first read found `record`'s watch: its context proved access, and each of its waiters holds it."""
        pending = self._looks[look]
        record.verified.add(pending.context)
        commands: list[Command] = []
        for waiter, identity in self._done(look).items():
            self._add_holder(record, identity, commands)
            commands.append(Resolve(waiter, record.key))
        return commands

    def _joined(self, look: int, pending: Pending, observation: Observation, ticket: int) -> list[Command]:
        key = pending.joining
        assert key is not None
        record = self._records.get(key)
        commands = [] if record is None else self._watching.apply(record, observation, ticket, self._now)
        for waiter, identity in self._done(look).items():
            if not observation.found:
                commands.extend(self._release(key, identity.context))
            commands.append(Resolve(waiter, key if observation.found else None))
        return commands

    def _look_failed(self, event: LookFailed) -> list[Command]:
        pending = self._looks.get(event.look)
        if pending is None:
            return []
        commands: list[Command] = []
        for waiter, identity in self._done(event.look).items():
            if pending.joining is not None:
                commands.extend(self._release(pending.joining, identity.context))
            commands.append(Fail(waiter, event.error))
        return commands

    def _done(self, look: int) -> dict[int, Identity]:
        """The look is over: no later caller shares it; its waiters (still there), who are answered now."""
        pending = self._looks.pop(look)
        if self._shared.get(pending.shared_as) == look:
            del self._shared[pending.shared_as]
        for waiter in pending.waiters:
            del self._waiting[waiter]
        return pending.waiters

    def _leave(self, waiter: int) -> list[Command]:
        """A caller gave up before its answer: dropped from its look (which goes on, and is applied, for whoever
        else waits or comes). A joiner lets go of the watch it held while it waited."""
        look = self._waiting.pop(waiter, None)
        if look is None:
            return []  # answered already: what it holds, it releases
        pending = self._looks[look]
        identity = pending.waiters.pop(waiter)
        if pending.joining is not None:
            return self._release(pending.joining, identity.context)
        return []

    # -- holders and lifecycle ------------------------------------------------------------------------------

    def _add_holder(self, record: Record, identity: Identity, commands: list[Command]) -> None:
        record.holders += 1
        if record.holders == 1:
            commands.append(Track(record.key))
        if record.stage is Stage.LINGERING:
            self._live(record, commands)
        share = record.shares.get(identity.context)
        if share is None:
            share = record.shares[identity.context] = Share(identity)
            commands.append(Cover(identity, record.key.kind, record.key.uri))
        share.handles += 1

    def _release(self, key: WatchKey, context: str) -> list[Command]:
        record = self._records.get(key)
        if record is None:
            return []
        commands: list[Command] = []
        record.holders -= 1
        share = record.shares.get(context)
        if share is not None:
            share.handles -= 1
            if share.handles <= 0:
                del record.shares[context]  # the identity leaves memory with its last stream
                commands.append(Uncover(context, key.kind, key.uri))
        if record.holders <= 0:
            # No local interest: the lease goes to a replica that still has some; we linger, unpolled. (A watch
            # still starting lingers once its first look is published.)
            commands.append(Untrack(key))
            if record.stage is Stage.LIVE:
                self._linger(record, commands)
        return commands

    def _live(self, record: Record, commands: list[Command]) -> None:
        if record.linger is not None:
            commands.append(CancelTimer(record.linger))
            del self._timers[record.linger]
            record.linger = None
        record.stage = Stage.LIVE

    def _linger(self, record: Record, commands: list[Command]) -> None:
        """Held by none: ends after the linger (restarted, when it lingers already)."""
        if record.linger is not None:
            commands.append(CancelTimer(record.linger))
            del self._timers[record.linger]
        record.stage = Stage.LINGERING
        record.linger = next(self._ids)
        self._timers[record.linger] = record.key
        commands.append(SetTimer(record.linger, self._now + self._linger_s))

    def _expire(self, timer: int) -> list[Command]:
        key = self._timers.pop(timer, None)
        record = None if key is None else self._records.get(key)
        if record is None or record.linger != timer:
            return []
        record.linger = None
        if record.stage is not Stage.LINGERING or record.holders > 0:
            return []
        record.stage = Stage.ENDED
        del self._records[record.key]
        self.index.remove(record.key)
        return [*self._watching.stop(record, self._now), StopWatch(record.key, record.native)]

    def close(self) -> None:
        """Shutdown: the driver cancels every waiter and stops every watch itself; nothing is kept."""
        for record in self._records.values():
            record.stage = Stage.ENDED
        self._records.clear()
        self.index.clear()
        self._timers.clear()
        self._looks.clear()
        self._shared.clear()
        self._waiting.clear()
        self._writes.close()
