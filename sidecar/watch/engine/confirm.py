"""Whether a look that saw an error state is applied yet, as pure state (`ErrorConfirmation`).

A JSON-RPC error the upstream answers for a watched resource is the resource's state (invariant 24), told to its
listeners like any change, but only once a second look confirms it: a lone error between two looks that see the
same content tells nobody. The confirming look comes soon, on a hinted look's schedule (never sooner than
`min_interval_ms` after the last, within the hint and read budgets). Two error looks in a row confirm the state
(the second one's), so an upstream whose error message differs at every read costs one extra look an interval,
never a look every `min_interval_ms`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.watch.fingerprint import is_error_state

__all__ = ["ErrorConfirmation", "LookAgain", "Seen", "Take"]


@dataclass(frozen=True, slots=True)
class Seen:
    """A look newer than every look applied to the watch saw `fingerprint`; the watch's state is `current`."""

    current: str
    fingerprint: str


@dataclass(frozen=True, slots=True)
class Take:
    """The look is applied: its fingerprint is the watch's state now (a change, when it differs)."""


@dataclass(frozen=True, slots=True)
class LookAgain:
    """The look saw a new error state and is not applied: nobody is told until a second look confirms it."""


class ErrorConfirmation:
    """One watch's unconfirmed error state: its one owner, written only by `handle`."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: str | None = None
        """The error state the last look saw and nobody was told of yet."""

    def handle(self, event: Seen, now: float) -> list[Take | LookAgain]:
        """What a look that saw `event.fingerprint` asks for (the rule reads no time; `now` as every machine's)."""
        new_error = is_error_state(event.fingerprint) and event.fingerprint != event.current
        if not new_error or self.pending is not None:
            # Content, not-found or the state it is in already (which ends any doubt), or the second error look in
            # a row (which confirms one).
            self.pending = None
            return [Take()]
        self.pending = event.fingerprint
        return [LookAgain()]

    def clear(self) -> None:
        """Another replica's look was taken as this watch's: an error this one saw is no longer the latest look."""
        self.pending = None
