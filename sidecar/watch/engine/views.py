"""What others see of a watch: its coordinator's view (`WatchState`) and the status page's summary. Both read the
engine's record; neither keeps or writes any watch state (the engine is its one writer)."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sidecar.changes import WatchKey
from sidecar.watch.engine.record import Record

__all__ = ["CoordinatorView", "WatchSummary", "busiest"]


@dataclass(frozen=True, slots=True)
class WatchSummary:
    """One watch as the status page shows it (times of day, on the wall clock)."""

    key: WatchKey
    fingerprint: str
    generation: int
    native: bool
    interval_s: float
    last_poll_at: float | None
    last_change_at: float | None
    consecutive_errors: int
    refs: int

    @classmethod
    def of(cls, record: Record, *, now: float, wall: float) -> WatchSummary:
        """`record` at `now` on the engine's clock, which is `wall` on the wall clock."""

        def shown(at: float | None) -> float | None:
            return None if at is None else wall - (now - at)

        return cls(
            record.key,
            record.fingerprint,
            record.generation,
            record.native,
            record.interval_s,
            shown(record.last_poll_at),
            shown(record.last_change_at),
            record.consecutive_errors,
            record.holders,
        )


class CoordinatorView:
    """A watch as its coordinator sees it (`sidecar.changes.WatchState`): its key, what its streams were last told,
    and a way to have it poll soon."""

    __slots__ = ("_hint", "_record", "key")

    def __init__(
        self, key: WatchKey, record: Callable[[WatchKey], Record | None], hint: Callable[[WatchKey], None]
    ) -> None:
        self.key = key
        self._record = record
        self._hint = hint

    @property
    def fingerprint(self) -> str:
        record = self._record(self.key)
        return "" if record is None else record.fingerprint

    def hint(self) -> None:
        self._hint(self.key)


def busiest(records: Iterable[Record], most: int) -> list[Record]:
    """The `most` records with the most holders, those first, ties in the order given (the order the watches
    started): what the status page shows, chosen without summarising or sorting every watch."""
    return heapq.nlargest(most, records, key=lambda record: record.holders)
