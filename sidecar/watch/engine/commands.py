"""What the watch engine asks for: every effect of an event, as a value the driver carries out.

The engine never awaits and never touches a socket, a timer or a metric; the driver (`sidecar.watch.registry`)
does each of these and feeds what comes back as events. Plain frozen values, so a test can expect the exact list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sidecar.changes import WatchKey, WatchKind
from sidecar.identity import Identity
from sidecar.watch.observation import Observation

__all__ = [
    "AnnounceWrites",
    "BudgetShare",
    "CancelTimer",
    "Command",
    "Cover",
    "Fail",
    "Interval",
    "LinkPoll",
    "Observed",
    "Publish",
    "PublishFirst",
    "Resolve",
    "Revoke",
    "SetTimer",
    "StartLook",
    "StartPoll",
    "StartWatch",
    "StopWatch",
    "Track",
    "Uncover",
    "Untrack",
    "Waited",
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
    """`key`'s watch ended (its poll in flight, if any, is cancelled); `native`: the upstream covered it."""

    key: WatchKey
    native: bool = False


@dataclass(frozen=True, slots=True)
class PublishFirst:
    """Publish the first look of `key` (a baseline event, no stream is told), then feed Published(look)."""

    look: int
    key: WatchKey
    fingerprint: str


@dataclass(frozen=True, slots=True)
class Observed:
    """A look at `key` that started at `ticket` was applied (newer than every look before it): whoever keeps an
    answer it contradicts drops it (the read-through cache), before any change event exists."""

    key: WatchKey
    fingerprint: str
    ticket: int


@dataclass(frozen=True, slots=True)
class Publish:
    """A look saw `key` change to `fingerprint`, its change number `generation` here: publish it (every stream
    holding the key is told through the bus)."""

    key: WatchKey
    fingerprint: str
    generation: int
    previous: str = field(default="", compare=False)
    """What its streams were told before (for the change's log line; not part of what is asked)."""


@dataclass(frozen=True, slots=True)
class StartPoll:
    """Poll `key` now with the credential of a context that holds it; it was due at `due` (a `hinted` poll, or a
    regular one). Answered by PollDone, PollFailed, PollSkipped or PollCrashed, then PollFinished."""

    key: WatchKey
    due: float
    hinted: bool


@dataclass(frozen=True, slots=True)
class Waited:
    """A poll was deferred `seconds` past when it was wanted by `limit` (a wait, never a refusal)."""

    limit: str
    seconds: float


@dataclass(frozen=True, slots=True)
class Interval:
    """The interval a regular poll was armed for (a backoff is not one)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class BudgetShare:
    """This replica's share of the read budget now (reads a second), as a poll took its slot."""

    per_s: float


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
class AnnounceWrites:
    """Tell the other replicas of a round of writes in `contexts` (their lease owners' watches look soon)."""

    contexts: frozenset[str]


@dataclass(frozen=True, slots=True)
class LinkPoll:
    """`key`'s next poll links to the traced writes that asked for it (`links`, tracing on only)."""

    key: WatchKey
    links: tuple[Any, ...]


Command = (
    StartLook
    | StartWatch
    | StopWatch
    | PublishFirst
    | Observed
    | Publish
    | StartPoll
    | Waited
    | Interval
    | BudgetShare
    | Resolve
    | Fail
    | SetTimer
    | CancelTimer
    | Track
    | Untrack
    | Cover
    | Uncover
    | Revoke
    | AnnounceWrites
    | LinkPoll
)
