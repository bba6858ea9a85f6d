"""Who can read the upstream, as the replicas say it (pure bookkeeping, no I/O; `sidecar.bus.reach` does the I/O).

A replica that has not reached the upstream for a while declares it (`ReadSignal` says when: one failed poll is
not enough, and a replica that reads again waits a little longer before it says so). A declaration alone moves
nothing: a replica cut from the upstream is one that *another replica* has read the upstream after it declared,
and confirmed so. So when the upstream is down for everyone, every replica declares, nobody confirms, and
ownership and streams stay as they are (invariant 14); when it is down for one replica only, its keys and its
clients move to those that read (invariant 23).

Stored in Redis as one hash field per declaring replica: `d:<epoch>` declared, `c:<epoch>:<confirmer>` confirmed;
the epoch tells one declaration from the next, so a late confirmation of an old one changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["Declaration", "ReadSignal", "ReaderBoard", "confirmed_value", "declared_value"]


class ReadSignal:
    """This replica's own signal, with hysteresis: it stops reading once it has not been able to for `down_after_s`,
    and reads again once it has been able to for `up_after_s`. Samples in between that disagree restart the wait,
    so a poll that fails once, or an upstream that answers slowly, moves nothing."""

    def __init__(self, down_after_s: float, up_after_s: float) -> None:
        self._down_after_s = down_after_s
        self._up_after_s = up_after_s
        self.reads = True
        self._since: float | None = None
        """When the samples began to disagree with `reads` (None while they agree)."""

    def sample(self, reads_now: bool, now: float) -> bool:
        """What the replica says after this sample (taken at `now`, monotonic)."""
        if reads_now == self.reads:
            self._since = None
            return self.reads
        if self._since is None:
            self._since = now
        wait = self._down_after_s if self.reads else self._up_after_s
        if now - self._since >= wait:
            self.reads, self._since = reads_now, None
        return self.reads


@dataclass(frozen=True, slots=True)
class Declaration:
    """A replica said it cannot read (`epoch` tells this saying from another); `confirmer` read after it did."""

    epoch: str
    confirmer: str | None = None


def declared_value(epoch: str) -> str:
    return f"d:{epoch}"


def confirmed_value(epoch: str, confirmer: str) -> str:
    return f"c:{epoch}:{confirmer}"


def _parse(value: str) -> Declaration | None:
    kind, _, rest = value.partition(":")
    if kind == "d" and rest:
        return Declaration(rest)
    epoch, _, confirmer = rest.partition(":")
    if kind == "c" and epoch and confirmer:
        return Declaration(epoch, confirmer)
    return None  # not ours to read (another version's): taken as no declaration


class ReaderBoard:
    """Each replica's declaration as last heard; the replicas cut (declared and confirmed); whether `me` has moved
    (it is cut and a live peer reads)."""

    def __init__(self, me: str) -> None:
        self.me = me
        self._declarations: dict[str, Declaration] = {}

    def replace(self, stored: Mapping[str, str]) -> None:
        """Every declaration, as read from Redis at once."""
        self._declarations = {}
        for instance, value in stored.items():
            self.apply(instance, value)

    def apply(self, instance: str, value: str | None) -> None:
        """One replica's declaration changed (None: withdrawn)."""
        declaration = _parse(value) if value is not None else None
        if declaration is None:
            self._declarations.pop(instance, None)
        else:
            self._declarations[instance] = declaration

    def forget(self, instance: str) -> None:
        self._declarations.pop(instance, None)

    def of(self, instance: str) -> Declaration | None:
        return self._declarations.get(instance)

    def unconfirmed(self) -> dict[str, str]:
        """Declarations nobody confirmed yet, by instance: their epochs."""
        return {instance: d.epoch for instance, d in self._declarations.items() if d.confirmer is None}

    def cut(self) -> frozenset[str]:
        """The replicas cut from the upstream: declared, and confirmed by a replica that read after."""
        return frozenset(instance for instance, d in self._declarations.items() if d.confirmer is not None)

    def readers(self, live: Iterable[str]) -> frozenset[str]:
        """The live replicas that have declared nothing."""
        return frozenset(instance for instance in live if instance not in self._declarations)

    def moved(self, live: Iterable[str]) -> bool:
        """`me` is cut from the upstream while a live peer reads: its clients belong elsewhere. With no peer that
        reads (the upstream down for every live replica), they stay (invariant 14)."""
        return self.me in self.cut() and bool(self.readers(live) - {self.me})
