"""What the Redis bus's machine (`sidecar.bus.machine`) is told: what the bus's parts read from Redis and from
the other replicas, and what became of the calls they made."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.changes import ChangeEvent, WatchKey

__all__ = [
    "Beat",
    "BusEvent",
    "ChangeHeard",
    "CleanUpEnded",
    "CutChanged",
    "FenceRefused",
    "Fenced",
    "InterestHeard",
    "InterestRemoved",
    "OursQueued",
    "OursWritten",
    "ReplicaLeft",
    "StoredRead",
    "TakenOver",
    "Untracked",
]


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
