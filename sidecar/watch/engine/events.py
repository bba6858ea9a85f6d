"""What happens to the watch engine: everything it learns arrives as one of these, with the time it happened.

The driver (`sidecar.watch.registry`) turns I/O into events; the engine (`sidecar.watch.engine.core`) answers
each with commands. Plain frozen values, so a test can write the exact event it feeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sidecar.changes import ChangeEvent, WatchKey, WatchKind
from sidecar.identity import Identity
from sidecar.protocol import JsonObject
from sidecar.watch.observation import Observation

__all__ = [
    "ChangeHeard",
    "Covered",
    "Event",
    "Forwarded",
    "Hinted",
    "Leave",
    "LookDone",
    "LookFailed",
    "PollCrashed",
    "PollDone",
    "PollFailed",
    "PollFinished",
    "PollSkipped",
    "Published",
    "Recovered",
    "Refused",
    "Release",
    "Subscribe",
    "TimerFired",
    "WritesHeard",
    "Wrote",
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
    link: Any = None
    """The request's traced span, as a link (tracing on only): the polls a write causes link to it."""


@dataclass(frozen=True, slots=True)
class Wrote:
    """A request of `context` that may have written went through (`link`: its traced span, tracing on only)."""

    context: str
    link: Any = None


@dataclass(frozen=True, slots=True)
class WritesHeard:
    """Another replica told of writes in `contexts`: their watches here look soon (never told on again)."""

    contexts: frozenset[str]


@dataclass(frozen=True, slots=True)
class Refused:
    """The upstream refused `identity` a forwarded request (401/403)."""

    method: str
    params: JsonObject
    identity: Identity


@dataclass(frozen=True, slots=True)
class Hinted:
    """`key` may have changed (a write, the upstream's or the source's word, a lost cover): its watch looks soon. A
    `warm` hint keeps it looking a few times while it sees no change (`hints.settle_ms`)."""

    key: WatchKey
    warm: bool = False


@dataclass(frozen=True, slots=True)
class Recovered:
    """The upstream answers again: every failing watch retries now instead of waiting out its backoff (once)."""


@dataclass(frozen=True, slots=True)
class Covered:
    """The upstream's own notifications cover `key` now (`native`), or no longer do (it polls at once)."""

    key: WatchKey
    native: bool


@dataclass(frozen=True, slots=True)
class PollDone:
    """The poll of `key` that started at `started` (ticket `ticket`) saw `observation`."""

    key: WatchKey
    started: float
    ticket: int
    observation: Observation


@dataclass(frozen=True, slots=True)
class PollFailed:
    """The poll of `key` that started at `started` failed; `refused`: the context whose credential the upstream
    refused (401/403), if that is why."""

    key: WatchKey
    started: float
    refused: str | None = None


@dataclass(frozen=True, slots=True)
class PollSkipped:
    """The poll of `key` that started at `started` had nobody to poll for (no stream holds it any more)."""

    key: WatchKey
    started: float


@dataclass(frozen=True, slots=True)
class PollCrashed:
    """The poll of `key`, which started at `started`, raised what no upstream failure explains (a bug): it counts as
    failed from its start (so its backoff never lands in the past)."""

    key: WatchKey
    started: float


@dataclass(frozen=True, slots=True)
class PollFinished:
    """The poll of `key` is over (its change, if any, published): the next one is armed."""

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
    | Hinted
    | Recovered
    | Covered
    | PollDone
    | PollFailed
    | PollSkipped
    | PollCrashed
    | PollFinished
    | Wrote
    | WritesHeard
)
