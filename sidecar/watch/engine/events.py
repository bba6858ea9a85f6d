"""What happens to the watch engine: everything it learns arrives as one of these, with the time it happened.

The driver (`sidecar.watch.registry`) turns I/O into events; the engine (`sidecar.watch.engine.core`) answers
each with commands. Plain frozen values, so a test can write the exact event it feeds.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.changes import ChangeEvent, WatchKey, WatchKind
from sidecar.identity import Identity
from sidecar.protocol.types import JsonObject
from sidecar.watch.observation import Observation

__all__ = [
    "ChangeHeard",
    "Event",
    "Forwarded",
    "Leave",
    "LookDone",
    "LookFailed",
    "PollRefused",
    "Published",
    "Refused",
    "Release",
    "Subscribe",
    "TimerFired",
]


@dataclass(frozen=True, slots=True)
class Subscribe:
    """A stream wants (kind, uri) as `identity`; `waiter` is answered once it may be acked."""

    waiter: int
    kind: WatchKind
    uri: str | None
    identity: Identity


@dataclass(frozen=True, slots=True)
class Leave:
    """`waiter` gave up before it was answered: it is dropped from the look it waited on."""

    waiter: int


@dataclass(frozen=True, slots=True)
class Release:
    """One holder of `key` in `context` let go (a stream ended or unsubscribed)."""

    key: WatchKey
    context: str


@dataclass(frozen=True, slots=True)
class LookDone:
    """The look the engine asked for saw `observation`; it started at `ticket`."""

    look: int
    ticket: int
    observation: Observation


@dataclass(frozen=True, slots=True)
class LookFailed:
    """The look the engine asked for could not be made (the upstream failed, or the client's turn never came)."""

    look: int
    error: Exception


@dataclass(frozen=True, slots=True)
class Published:
    """The first look of a new watch is on the bus (`error`: the publish failed)."""

    look: int
    error: Exception | None = None


@dataclass(frozen=True, slots=True)
class TimerFired:
    timer: int


@dataclass(frozen=True, slots=True)
class ChangeHeard:
    """A change event on the bus, ours or another replica's."""

    event: ChangeEvent


@dataclass(frozen=True, slots=True)
class Forwarded:
    """A request went through to the upstream and came back with `answer`; it started at `ticket`."""

    method: str
    params: JsonObject
    identity: Identity
    answer: JsonObject
    ticket: int


@dataclass(frozen=True, slots=True)
class Refused:
    """The upstream refused `identity` a forwarded request (401/403)."""

    method: str
    params: JsonObject
    identity: Identity


@dataclass(frozen=True, slots=True)
class PollRefused:
    """The upstream refused a poll of `key` (401/403)."""

    key: WatchKey


Event = (
    Subscribe
    | Leave
    | Release
    | LookDone
    | LookFailed
    | Published
    | TimerFired
    | ChangeHeard
    | Forwarded
    | Refused
    | PollRefused
)
