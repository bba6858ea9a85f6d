"""What the engine keeps about one watch and about one look its callers wait on, and where a watch is in its life."""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field

from sidecar.changes import WatchKey, WatchKind
from sidecar.identity import ANONYMOUS, Identity
from sidecar.watch.engine.confirm import ErrorConfirmation
from sidecar.watch.engine.polls import PollPlan
from sidecar.watch.tickets import Latest

__all__ = ["Pending", "Record", "Share", "Stage"]


class Stage(enum.Enum):
    """Where a watch is in its life. Only a lingering watch may expire; an ended one is gone from the engine."""

    STARTING = "starting"
    """Its first look is being published: the callers that asked for it are answered when the publish returns."""
    LIVE = "live"
    """Held by at least one stream."""
    LINGERING = "lingering"
    """Held by none, unpolled, kept a moment for a reconnecting client; its timer ends it."""
    ENDED = "ended"


@dataclass(slots=True)
class Share:
    """One authorization context's share of a watch: the identity it is polled with, and how many of the
    context's streams hold it."""

    identity: Identity
    handles: int = 0


@dataclass(slots=True)
class Record:
    """Everything the engine keeps about one watch: who holds it, where it is in its life, what its streams were
    last told and when it polls. Written by the engine alone (`sidecar.watch.engine`); the driver reads it."""

    key: WatchKey
    stage: Stage = Stage.STARTING
    holders: int = 0
    """The one count of the streams that hold it (each context's part of it is its share's `handles`)."""
    shares: dict[str, Share] = field(default_factory=dict)
    """Per context holding it: the only place the identities the sidecar polls with live."""
    verified: set[str] = field(default_factory=set)
    """Contexts whose own read of it succeeded (they may join a public watch)."""
    linger: int | None = None
    """The timer that ends it, while it lingers."""
    fingerprint: str = ""
    """What its streams were last told: the content hash of the latest look applied (or adopted from the bus)."""
    generation: int = 0
    """Its changes as this process counts them (its own and those adopted): the generation its events carry on a
    bus of one process (the Redis bus numbers a key's changes by its stored state instead)."""
    latest: Latest = field(default_factory=lambda: Latest(0))
    """The ticket of the latest look applied to it (invariant 7)."""
    confirmation: ErrorConfirmation = field(default_factory=ErrorConfirmation)
    """The error state a look saw that a second look must confirm before anyone is told (invariant 24)."""
    ttl_ms: int | None = None
    """The upstream's ttlMs of the latest look that was not an error state."""
    rule_interval_ms: int | None = None
    """The interval `polling.rules` gives this key instead of its ttlMs."""
    native: bool = False
    """The upstream's own notifications cover this key: it polls at once on them, and as a backstop."""
    wanted_ms: float = 0.0
    """Its interval before jitter, were there no read budget."""
    interval_s: float = 0.0
    """The regular interval its last poll was armed for (jittered, under the read budget)."""
    plan: PollPlan | None = None
    """When it polls (from its first look on)."""
    last_poll_at: float | None = None
    """When its last poll was answered (on the engine's time)."""
    last_change_at: float | None = None
    """When a look last saw it change (on the engine's time)."""

    @property
    def poller(self) -> Identity | None:
        """The identity a poll goes with now (a refusal of the poll concerns its context, which PollFailed names);
        None while no stream holds it (lingering: no credential to poll with). Public data is the same for
        everyone: polled without credentials when an anonymous client holds it."""
        if not self.shares:
            return None
        return self.shares[ANONYMOUS if ANONYMOUS in self.shares else next(iter(self.shares))].identity

    @property
    def refs(self) -> int:
        """How many streams hold it."""
        return self.holders

    @property
    def consecutive_errors(self) -> int:
        return 0 if self.plan is None else self.plan.errors


@dataclass(slots=True)
class Pending:
    """A look callers wait on: a first read of (kind, uri) for `context`, or (`joining`) a joiner's look at a live
    watch, whose waiters hold it already."""

    shared_as: Hashable
    """Its place among the looks that later callers may share."""
    kind: WatchKind
    uri: str | None
    context: str
    joining: WatchKey | None
    waiters: dict[int, Identity] = field(default_factory=dict)
    """Waiter -> its identity (a joiner's look is shared across the contexts verified for a public watch)."""
    key: WatchKey | None = None
    """A first read that started its watch: the watch whose first look is being published."""
