"""What the watch engine asks for: every effect of an event, as a value the driver carries out.

The engine never awaits and never touches a socket, a timer or a metric; the driver (`sidecar.watch.registry`)
does each of these and feeds what comes back as events. Plain frozen values, so a test can expect the exact list.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.changes import WatchKey, WatchKind
from sidecar.identity import Identity
from sidecar.watch.observation import Observation

__all__ = [
    "Adopt",
    "Apply",
    "CancelTimer",
    "Command",
    "Cover",
    "Fail",
    "HintWrite",
    "PublishFirst",
    "Resolve",
    "Revoke",
    "SetTimer",
    "StartLook",
    "StartWatch",
    "StopWatch",
    "Track",
    "Uncover",
    "Untrack",
]


@dataclass(frozen=True, slots=True)
class StartLook:
    """Look at (kind, uri) upstream with `identity`'s credential, ticketed as it starts; `paced`: in the client's
    fair share (over its first-read rate), else at once among the polls. Answered by LookDone or LookFailed."""

    look: int
    kind: WatchKind
    uri: str | None
    identity: Identity
    paced: bool


@dataclass(frozen=True, slots=True)
class StartWatch:
    """Start polling `key` from its first look (`observation`, seen at `ticket`)."""

    key: WatchKey
    observation: Observation
    ticket: int


@dataclass(frozen=True, slots=True)
class StopWatch:
    key: WatchKey


@dataclass(frozen=True, slots=True)
class PublishFirst:
    """Publish the first look of `key` (a baseline event, no stream is told), then feed Published(look)."""

    look: int
    key: WatchKey
    fingerprint: str


@dataclass(frozen=True, slots=True)
class Apply:
    """Offer a look at `key` to its watch (the ticket rule decides; a change is published)."""

    key: WatchKey
    observation: Observation
    ticket: int


@dataclass(frozen=True, slots=True)
class Adopt:
    """Another replica saw `key` change to `fingerprint`: the watch takes it as its own."""

    key: WatchKey
    fingerprint: str


@dataclass(frozen=True, slots=True)
class Resolve:
    """`waiter` may be acked: it holds `key` now (one holder counted already); None: not found."""

    waiter: int
    key: WatchKey | None


@dataclass(frozen=True, slots=True)
class Fail:
    """`waiter`'s look failed with `error` (it holds nothing)."""

    waiter: int
    error: Exception


@dataclass(frozen=True, slots=True)
class SetTimer:
    """Feed TimerFired(timer) at `when` (on the time the events carry)."""

    timer: int
    when: float


@dataclass(frozen=True, slots=True)
class CancelTimer:
    timer: int


@dataclass(frozen=True, slots=True)
class Track:
    """This replica holds `key` now: it is among those that may take its lease."""

    key: WatchKey


@dataclass(frozen=True, slots=True)
class Untrack:
    key: WatchKey


@dataclass(frozen=True, slots=True)
class Cover:
    """`identity`'s context holds (kind, uri): cover it with the upstream's own notifications, if it can push."""

    identity: Identity
    kind: WatchKind
    uri: str | None


@dataclass(frozen=True, slots=True)
class Uncover:
    context: str
    kind: WatchKind
    uri: str | None


@dataclass(frozen=True, slots=True)
class Revoke:
    """`context`'s credential was refused for `key`: its streams on it end."""

    key: WatchKey
    context: str


@dataclass(frozen=True, slots=True)
class HintWrite:
    """A request of `context` that may have written went through: the watches it may concern look soon."""

    context: str


Command = (
    StartLook
    | StartWatch
    | StopWatch
    | PublishFirst
    | Apply
    | Adopt
    | Resolve
    | Fail
    | SetTimer
    | CancelTimer
    | Track
    | Untrack
    | Cover
    | Uncover
    | Revoke
    | HintWrite
)
