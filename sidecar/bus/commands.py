"""What the Redis bus's machine (`sidecar.bus.machine`) asks for: keys gained and lost, replicas to clean up,
interest to write again, and a key's own changes to deliver, adopt or publish again."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.changes import ChangeEvent, WatchKey

__all__ = [
    "Adopt",
    "BusCommand",
    "CleanUp",
    "Deliver",
    "Forgotten",
    "GaveUp",
    "Moved",
    "Poll",
    "RegisterAgain",
    "Republish",
]


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
