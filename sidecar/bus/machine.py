"""The Redis bus's rules as one machine, with no I/O: who is a live replica and which dead ones to clean up
(membership), which keys this replica polls (ownership, and so take-over), whose interest in a key counts while
ours is being written (interest routing), and which generation of each key this replica knows, so which stored
or heard change it tells, adopts or publishes again (the fence).

The bus's parts make the Redis calls and feed what they read here (`BusMachine.handle`): heartbeats read, interest
written and heard, changes heard, a key's stored state read, a fenced publish answered. What comes back is what to
do: keys gained and lost, replicas to clean up, interest to write again, changes to deliver, adopt or publish again.
`RedisBus` carries the commands out. The time given with each event stamps the changes the machine makes up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

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


# -- events: what the bus's parts read ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Beat:
    """A heartbeat of ours was answered: the live replicas, those whose heartbeat ran out, and whether ours had
    to list us again (we were taken for dead and cleaned up while only slow)."""

    live: frozenset[str]
    dead: tuple[str, ...]
    listed_again: bool


@dataclass(frozen=True, slots=True)
class InterestRemoved:
    """A dead replica's interest is gone from Redis (its clean-up removed it)."""

    instance: str


@dataclass(frozen=True, slots=True)
class CleanUpEnded:
    """A clean-up of a dead replica ended, done or cut short (a later heartbeat may list it dead again)."""

    instance: str


@dataclass(frozen=True, slots=True)
class ReplicaLeft:
    """Another replica said it left."""

    instance: str


@dataclass(frozen=True, slots=True)
class CutChanged:
    """The replicas cut from the upstream (confirmed by a peer that reads it)."""

    cut: frozenset[str]


@dataclass(frozen=True, slots=True)
class OursQueued:
    """Our interest in a key is queued to be written."""

    hashed: str


@dataclass(frozen=True, slots=True)
class OursWritten:
    """Our interest in a key is written; `members` are who Redis said is interested."""

    hashed: str
    members: frozenset[str]


@dataclass(frozen=True, slots=True)
class InterestHeard:
    """Another replica's interest in a key arrived or left (its bucket's interest message)."""

    hashed: str
    instance: str
    present: bool


@dataclass(frozen=True, slots=True)
class Untracked:
    """This replica no longer watches the key: it neither polls it nor keeps its fence (watched again, it starts
    afresh)."""

    key: WatchKey


@dataclass(frozen=True, slots=True)
class ChangeHeard:
    """Another replica's change was read on the bus; `ours` is what our watch of the key was last told (None when
    this replica does not watch it)."""

    event: ChangeEvent
    ours: str | None


@dataclass(frozen=True, slots=True)
class StoredRead:
    """A key's stored state (the last fingerprint told, its generation), read when this replica took the key over
    (`taking_over`) or when its interest was written; `ours` as in `ChangeHeard`."""

    key: WatchKey
    told: str | None
    stored: int
    ours: str | None
    taking_over: bool


@dataclass(frozen=True, slots=True)
class TakenOver:
    """A key this replica gained was taken over, and is still watched; `stored`: the generation its stored state
    said, None when nothing was told of it yet."""

    key: WatchKey
    stored: int | None


@dataclass(frozen=True, slots=True)
class Fenced:
    """A fenced publish answered with the stored generation `generation`, the key still watched."""

    key: WatchKey
    generation: int


@dataclass(frozen=True, slots=True)
class FenceRefused:
    """A fenced publish was refused for good: `told` (generation `generation`) is stored. `fresh`: the change was a
    look just now (its streams were told by the look); else an older one published again."""

    key: WatchKey
    told: str | None
    generation: int
    ours: str | None
    fresh: bool


BusEvent = (
    Beat
    | InterestRemoved
    | CleanUpEnded
    | ReplicaLeft
    | CutChanged
    | OursQueued
    | OursWritten
    | InterestHeard
    | Untracked
    | ChangeHeard
    | StoredRead
    | TakenOver
    | Fenced
    | FenceRefused
)


# -- commands: what the bus's parts do ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Moved:
    """The keys (hashes) this replica gained and lost: it takes the gained over and stops polling the lost."""

    gained: frozenset[str]
    lost: frozenset[str]


@dataclass(frozen=True, slots=True)
class GaveUp:
    """A key this replica polled is no longer watched here: nobody took it, this replica just stops."""

    hashed: str


@dataclass(frozen=True, slots=True)
class CleanUp:
    """Claim and clean up a dead replica (only while it is still dead)."""

    instance: str


@dataclass(frozen=True, slots=True)
class Forgotten:
    """A dead replica's interest is gone: whatever else this replica keeps of it goes too."""

    instance: str


@dataclass(frozen=True, slots=True)
class RegisterAgain:
    """We were taken for dead: every interest (and declaration) of ours is written again."""


@dataclass(frozen=True, slots=True)
class Deliver:
    """Tell this replica's listeners a change another replica told."""

    event: ChangeEvent


@dataclass(frozen=True, slots=True)
class Adopt:
    """Our watch takes a change it missed as its own; `tell`: its streams are told it too."""

    event: ChangeEvent
    tell: bool


@dataclass(frozen=True, slots=True)
class Republish:
    """Publish what our streams saw (newer than what is stored), fenced by the stored generation."""

    event: ChangeEvent


@dataclass(frozen=True, slots=True)
class Poll:
    """The key's watch polls soon (a key just taken over: a change nobody saw yet is told by its next look)."""

    key: WatchKey


BusCommand = Moved | GaveUp | CleanUp | Forgotten | RegisterAgain | Deliver | Adopt | Republish | Poll

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
