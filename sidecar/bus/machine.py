"""The Redis bus's rules as one machine, with no I/O: who is a live replica and which dead ones to clean up
(membership), which keys this replica polls (ownership, and so take-over), whose interest in a key counts while
ours is being written (interest routing), and which generation of each key this replica knows, so which stored
or heard change it tells, adopts or publishes again (the fence).

The bus's parts make the Redis calls and feed what they read here (`BusMachine.handle`): heartbeats read, interest
written and heard, changes heard, a key's stored state read, a fenced publish answered. What comes back is what to
do: keys gained and lost, replicas to clean up, interest to write again, changes to deliver, adopt or publish again.
`RedisBus` carries the commands out. The time given with each event stamps the changes the machine makes up.
The events are `sidecar.bus.events`, the commands `sidecar.bus.commands`; both are exported here, with the
machine, as its face: the parts import this module, not those two.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sidecar.bus.commands import (
    Adopt,
    BusCommand,
    CleanUp,
    Deliver,
    Forgotten,
    GaveUp,
    Moved,
    Poll,
    RegisterAgain,
    Republish,
)
from sidecar.bus.events import (
    Beat,
    BusEvent,
    ChangeHeard,
    CleanUpEnded,
    CutChanged,
    Fenced,
    FenceRefused,
    InterestHeard,
    InterestRemoved,
    OursQueued,
    OursWritten,
    ReplicaLeft,
    StoredRead,
    TakenOver,
    Untracked,
)
from sidecar.bus.layout import key_hash
from sidecar.bus.ownership import Ownership
from sidecar.changes import ChangeEvent, WatchKey

__all__ = [
    "Adopt",
    "Beat",
    "BusCommand",
    "BusEvent",
    "BusMachine",
    "ChangeHeard",
    "CleanUp",
    "CleanUpEnded",
    "CutChanged",
    "Decide",
    "Deliver",
    "FenceRefused",
    "Fenced",
    "Forgotten",
    "GaveUp",
    "InterestHeard",
    "InterestRemoved",
    "Moved",
    "OursQueued",
    "OursWritten",
    "Poll",
    "RegisterAgain",
    "ReplicaLeft",
    "Republish",
    "StoredRead",
    "TakenOver",
    "Untracked",
]


Decide = Callable[[BusEvent], list[BusCommand]]
"""An event fed to the bus's machine, the commands that are not the bus's own to carry out handed back."""


class BusMachine:
    """This replica's view of the cluster, and each event's consequences."""

    def __init__(self, instance: str) -> None:
        self._own = Ownership(instance)
        self._beaten = False
        """A heartbeat of ours was answered before: one that lists us again means we were taken for dead."""
        self._cleaning: set[str] = set()
        """Dead replicas whose clean-up runs here: a heartbeat listing one again does not start another."""
        self._joining: set[str] = set()
        """Keys (hashes) whose interest of ours is queued or being written: interest messages heard meanwhile wait
        in `_early`, as the members that write reads back replace this replica's view of who is interested."""
        self._early: dict[str, dict[str, bool]] = {}
        """Interest messages heard while ours in the key was being written (hash -> instance -> present): newer
        than the members that write reads back, so they win over them."""
        self._generation: dict[WatchKey, int] = {}
        """The latest generation (as stored in Redis) of each watched key known here: the publish fence."""

    # -- what the parts ask ----------------------------------------------------------------------------------

    @property
    def live(self) -> frozenset[str]:
        return self._own.live

    @property
    def owned_count(self) -> int:
        return len(self._own.owned)

    def owns(self, hashed: str) -> bool:
        return self._own.owns(hashed)

    def joining(self, hashed: str) -> bool:
        """Our interest in the key is queued or being written."""
        return hashed in self._joining

    def settling(self, hashed: str) -> bool:
        """Our interest in the key is queued or being written, or interest messages heard meanwhile wait for it."""
        return hashed in self._joining or hashed in self._early

    def known(self, key: WatchKey) -> int | None:
        """The key's latest generation known here; None when its fence has not learnt one since it was watched."""
        return self._generation.get(key)

    # -- events ----------------------------------------------------------------------------------------------

    def handle(self, event: BusEvent, now: float) -> list[BusCommand]:
        """`now`: the wall-clock time, which stamps the changes adopted or published again."""
        match event:
            case Beat():
                return self._beat(event)
            case InterestRemoved(instance):
                self._own.forget(instance)
                return [Forgotten(instance)]
            case CleanUpEnded(instance):
                self._cleaning.discard(instance)
                return []
            case ReplicaLeft(instance):
                return self._moved(self._own.set_live(self._own.live - {instance}))
            case CutChanged(cut):
                return self._moved(self._own.set_cut(cut))
            case OursQueued(hashed):
                self._joining.add(hashed)
                return []
            case OursWritten():
                return self._written(event)
            case InterestHeard(hashed, instance, present):
                if hashed in self._joining:
                    self._early.setdefault(hashed, {})[instance] = present
                    return []
                return self._moved(self._own.interest(hashed, instance, present))
            case Untracked(key):
                hashed = key_hash(key)
                self._joining.discard(hashed)
                self._early.pop(hashed, None)
                self._generation.pop(key, None)
                _, lost = self._own.untrack(hashed)
                return [GaveUp(hashed)] if lost else []
            case ChangeHeard():
                return self._heard(event)
            case StoredRead():
                return self._taking_over(event, now) if event.taking_over else self._caught_up(event, now)
            case TakenOver(key, stored):
                if stored is not None:
                    self._generation[key] = max(self._generation.get(key, 0), stored)
                return [Poll(key)]
            case Fenced(key, generation):
                self._generation[key] = generation
                return []
            case FenceRefused():
                return self._refused(event, now)

    # -- membership ------------------------------------------------------------------------------------------

    def _beat(self, beat: Beat) -> list[BusCommand]:
        commands: list[BusCommand] = []
        if beat.listed_again and self._beaten:
            commands.append(RegisterAgain())
        self._beaten = True
        commands += self._moved(self._own.set_live(beat.live))
        for instance in beat.dead:
            if instance not in self._cleaning:
                self._cleaning.add(instance)
                commands.append(CleanUp(instance))
        return commands

    # -- interest and ownership ------------------------------------------------------------------------------

    def _written(self, written: OursWritten) -> list[BusCommand]:
        hashed = written.hashed
        self._joining.discard(hashed)
        interested = set(written.members)
        for instance, present in self._early.pop(hashed, {}).items():
            if present:
                interested.add(instance)
            else:
                interested.discard(instance)
        return self._moved(self._own.track(hashed, interested))

    @staticmethod
    def _moved(change: tuple[Iterable[str], Iterable[str]]) -> list[BusCommand]:
        gained, lost = (frozenset(keys) for keys in change)
        return [Moved(gained, lost)] if gained or lost else []

    # -- the fence -------------------------------------------------------------------------------------------

    def _heard(self, heard: ChangeHeard) -> list[BusCommand]:
        event = heard.event
        if not event.baseline and heard.ours is not None:
            self._generation[event.key] = max(event.generation, self._generation.get(event.key, 0))
            if heard.ours == event.fingerprint:
                return []  # what our streams already have (their watch saw it first): not news here
        return [Deliver(event)]

    def _taking_over(self, read: StoredRead, now: float) -> list[BusCommand]:
        """A new owner starts from the key's stored state: it heard every change told (its generation is current)
        but its streams saw newer content (they joined after a change an owner saw and died holding): that is
        published to the others, not told to its own streams; it missed a change told (an older generation): its
        streams are told it now."""
        key, told, stored, ours = read.key, read.told, read.stored, read.ours
        if told is None or ours is None or told == ours:
            return []
        if self._generation.get(key, 0) >= stored:
            return [Republish(ChangeEvent(key, ours, stored, now))]
        self._generation[key] = stored
        return [Adopt(ChangeEvent(key, told, stored, now), tell=True)]

    def _caught_up(self, read: StoredRead, now: float) -> list[BusCommand]:
        """Our interest was written again (Redis came back, our subscriptions were renewed): a change told while we
        were not listening is in the key's stored state; our streams are told it now. A first write only learns
        the generation: the watch's own first look is newer than anything stored."""
        key, told, stored, ours = read.key, read.told, read.stored, read.ours
        known = self._generation.get(key)
        self._generation[key] = max(stored, known or 0)
        if known is None or stored <= known or told is None or ours is None or told == ours:
            return []
        return [Adopt(ChangeEvent(key, told, stored, now), tell=True)]

    def _refused(self, refused: FenceRefused, now: float) -> list[BusCommand]:
        """Another replica told a newer fingerprint: our watch takes it; an older change of ours published again
        also tells our streams (the message that carried it may never have reached us)."""
        if refused.ours is None or refused.told is None or refused.told == refused.ours:
            return []
        return [Adopt(ChangeEvent(refused.key, refused.told, refused.generation, now), tell=not refused.fresh)]
