"""What the engine keeps about one watch and about one look its callers wait on, and where a watch is in its life."""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field

from sidecar.changes import WatchKey, WatchKind
from sidecar.identity import Identity

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
    """Everything the engine keeps about one watch."""

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
    last_poller: str | None = None
    """The context whose identity the last poll went with: a refusal of that poll concerns that context alone."""


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
