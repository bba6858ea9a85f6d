"""What the registry keeps about one watch, and where the watch is in its life."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sidecar.watch.clock import Timer
from sidecar.watch.handles import ContextShare
from sidecar.watch.poller import Watch

__all__ = ["Entry", "Stage"]


class Stage(enum.Enum):
    """Where a watch is in its life. Only a lingering watch may expire; an ended one is gone from the registry."""

    STARTING = "starting"
    """Its first look is being published: callers waiting on that first look have not taken it yet."""
    LIVE = "live"
    """Held by at least one stream."""
    LINGERING = "lingering"
    """Held by none, unpolled, kept a moment for a reconnecting client; its timer ends it."""
    ENDED = "ended"


@dataclass(slots=True)
class Entry:
    """Everything the registry keeps about one watch."""

    watch: Watch
    stage: Stage = Stage.STARTING
    shares: dict[str, ContextShare] = field(default_factory=dict)
    """Per context holding it: the only place the identities the sidecar polls with live."""
    linger: Timer | None = None
    last_poller: str | None = None
    """The context whose identity the last poll went with (one of its shares, for a public key): a refusal of
    that poll concerns that context alone."""

    def live(self) -> None:
        """Held: no longer lingering."""
        if self.linger is not None:
            self.linger.cancel()
            self.linger = None
        self.stage = Stage.LIVE

    def lingers(self, timer: Timer) -> None:
        """Held by none: `timer` ends it (in place of the linger running already, if it lingers)."""
        if self.linger is not None:
            self.linger.cancel()
        self.stage = Stage.LINGERING
        self.linger = timer
