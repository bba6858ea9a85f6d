"""Whether this replica can read the upstream, told to the others with its heartbeats, and what the others said:
the replicas cut from the upstream (`sidecar.bus.readers` has the rules) go to ownership, and this replica's own
cut moves its clients (invariant 23).

Costs Redis nothing at rest: a heartbeat writes this replica's declaration only when what it says changes (one
script: the field of the readers hash and a message on the revalidate channel, which every replica hears), and a
replica reads the whole hash only when that channel is (re)subscribed. A declaration is confirmed by a peer that
read the upstream after hearing it (one exchange of its own), in the same script, guarded by the epoch.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from sidecar.bus.connect import REDIS_FAILURES
from sidecar.bus.layout import HINTS_CHANNEL, READERS, text
from sidecar.bus.link import Link
from sidecar.bus.machine import BusMachine, CutChanged, Decide
from sidecar.bus.readers import ReaderBoard, ReadSignal, confirmed_value, declared_value
from sidecar.observability.metrics import Metrics
from sidecar.tasks import TaskSet

__all__ = ["Reach", "Readable"]

logger = logging.getLogger(__name__)

_UP_AFTER_LEASES = 2
"""A replica that reads again says so after two leases of answers (it stops reading after one lease of failures):
keys that moved away do not flap back on the first answer."""


class Readable(Protocol):
    """What the bus asks of the upstream: the readiness verdict, and one exchange now."""

    @property
    def not_ready_reason(self) -> str | None: ...

    async def answers_now(self) -> bool:
        """One exchange with the upstream, started now: True when it answered."""
        ...


class Reach:
    """This replica's declaration, the board of everyone's, and this replica's move (its clients to the readers)."""

    def __init__(
        self,
        link: Link,
        machine: BusMachine,
        decide: Decide,
        background: TaskSet,
        metrics: Metrics,
        *,
        upstream: Readable | None,
        lease_ms: int,
    ) -> None:
        self._link = link
        self._machine = machine
        self._decide = decide
        self._background = background
        self._metrics = metrics
        self._upstream = upstream
        self._lease_s = lease_ms / 1000
        self._signal = ReadSignal(self._lease_s, _UP_AFTER_LEASES * self._lease_s)
        self._board = ReaderBoard(link.instance)
        self._written: bool | None = None
        """What Redis holds of us: True nothing (we read), False our declaration, None not known (write it again)."""
        self._epoch = ""
        self._confirming = False
        self._tried: dict[tuple[str, str], float] = {}
        """(instance, epoch) -> when we last tried to confirm it (monotonic)."""
        self._reloading: list[tuple[str, str | None]] | None = None
        """Declarations heard while the hash is being read: applied over what the read returns."""
        self._moved = False
        self._checking = False
        self._checked_at = -float("inf")
        """When this replica last checked, by an exchange of its own, that it cannot read before moving its clients."""
        self._beat_failed = False
        self._listeners: list[Callable[[bool], None]] = []

    # -- what the others see ---------------------------------------------------------------------------------------

    @property
    def moved(self) -> str | None:
        """Why this replica's clients belong elsewhere (cut from the upstream while a peer reads), or None."""
        if not self._moved:
            return None
        return "this replica cannot reach the upstream and another replica can: its clients and keys moved there"

    def on_moved(self, listener: Callable[[bool], None]) -> None:
        """`listener(True)` when this replica's clients should move to the readers, `listener(False)` when not."""
        self._listeners.append(listener)

    # -- the heartbeat's part --------------------------------------------------------------------------------------

    async def beat(self) -> None:
        """After each heartbeat: sample this replica's signal, write its declaration when what it says changed,
        confirm a peer's declaration (when this replica reads) and follow the live set. Redis's failures are the
        heartbeat's to handle; any other error is logged (once) and the heartbeats go on."""
        try:
            await self._beat()
        except REDIS_FAILURES:
            raise
        except Exception:  # boundary: a replica whose heartbeats stopped would be taken for dead
            if not self._beat_failed:
                self._beat_failed = True
                logger.exception("telling whether this replica can read the upstream failed; heartbeats go on")

    async def _beat(self) -> None:
        if self._upstream is not None:
            reads = self._signal.sample(self._upstream.not_ready_reason is None, time.monotonic())
            if reads != self._written:
                kept = self._board.of(self._link.instance)
                if not reads and self._written is None and kept is not None and kept.epoch == self._epoch:
                    self._written = False  # Redis kept our declaration (and its confirmation) through the gap
                else:
                    await self._write(reads)
            if reads and not self._confirming:
                self._confirm_due()
        self._settle()

    def rewrite(self) -> None:
        """Redis may have lost our declaration (it restarted, or we were cleaned up as dead): written again."""
        self._written = None

    async def _write(self, reads: bool) -> None:
        me = self._link.instance
        if reads:
            self._epoch = ""
        elif not self._epoch or self._written is not None:
            self._epoch = secrets.token_hex(4)  # a new declaration (one Redis lost keeps its epoch)
        value = declared_value(self._epoch) if self._epoch else ""
        told = await self._set(me, value, "")
        self._written = reads
        self._board.apply(me, value or None)
        if reads:
            if told:
                logger.info("upstream readable again from this replica; told the others")
        else:
            logger.warning(
                "upstream unreadable from this replica; told the others (keys and clients move if another reads)",
                extra={"reason": self._upstream.not_ready_reason if self._upstream else None},
            )
        self._settle()

    def _confirm_due(self) -> None:
        live = self._machine.live
        now = time.monotonic()
        due = {
            instance: epoch
            for instance, epoch in self._board.unconfirmed().items()
            if instance in live and instance != self._link.instance
            and now - self._tried.get((instance, epoch), -self._lease_s) >= self._lease_s
        }  # fmt: skip
        if due:
            self._confirming = True
            for instance, epoch in due.items():
                self._tried[(instance, epoch)] = now
            self._background.spawn(self._confirm(due))

    async def _confirm(self, due: dict[str, str]) -> None:
        """A peer said it cannot read: read the upstream ourselves, now; if it answers, the peer is cut."""
        try:
            assert self._upstream is not None
            if not await self._upstream.answers_now():
                return
            me = self._link.instance
            for instance, epoch in due.items():
                declaration = self._board.of(instance)
                if declaration is None or declaration.epoch != epoch or declaration.confirmer is not None:
                    continue
                value = confirmed_value(epoch, me)
                try:
                    if await self._set(instance, value, declared_value(epoch)):
                        self._board.apply(instance, value)
                        logger.info("a peer cannot reach the upstream and this replica can: its keys move here")
                except REDIS_FAILURES as exc:
                    self._link.failed(exc)
                    return
            self._settle()
        finally:
            self._confirming = False

    async def _set(self, instance: str, value: str, expect: str) -> bool:
        message = orjson.dumps({"o": self._link.instance, "c": [], "r": {"i": instance, "v": value or None}})
        return bool(
            await self._link.scripts.declare(keys=[READERS], args=[instance, value, expect, HINTS_CHANNEL, message])
        )

    # -- what the bus hears ----------------------------------------------------------------------------------------

    def heard(self, declaration: Any) -> None:
        """Another replica's declaration changed (a message on the revalidate channel)."""
        try:
            instance = str(declaration["i"])
            value = declaration["v"]
            value = None if value is None else str(value)
        except (KeyError, TypeError):
            logger.warning("undecodable message on the bus; ignored")
            return
        if self._reloading is not None:
            self._reloading.append((instance, value))
        self._board.apply(instance, value)
        self._settle()

    async def reload(self) -> None:
        """The revalidate channel is (re)subscribed: declarations told while it was not are read at once, and ours
        is written again with the next heartbeat."""
        self._written = None
        self._reloading = []
        try:
            stored = await self._link.client.hgetall(READERS)
        except REDIS_FAILURES as exc:
            self._link.failed(exc)
            return
        finally:
            heard, self._reloading = self._reloading or [], None
        self._board.replace({text(field): text(value) for field, value in stored.items()})
        for instance, value in heard:
            self._board.apply(instance, value)
        self._settle()

    def forget(self, instance: str) -> None:
        """A dead replica was cleaned up (its field too)."""
        self._board.forget(instance)
        self._settle()

    # -- what follows ----------------------------------------------------------------------------------------------

    def _settle(self) -> None:
        self._decide(CutChanged(self._board.cut()))
        moved = self._board.moved(self._machine.live)
        if moved and not self._moved and self._upstream is not None:
            # Confirmed; but the upstream may have come back for every replica between our declaration and its
            # confirmation. Our clients leave only if an exchange of our own, now, is not answered within a lease.
            self._check_before_moving()
            return
        self._follow(moved)

    def _check_before_moving(self) -> None:
        now = time.monotonic()
        if self._checking or now - self._checked_at < self._lease_s:
            return
        self._checking, self._checked_at = True, now
        self._background.spawn(self._check_then_move())

    async def _check_then_move(self) -> None:
        assert self._upstream is not None
        try:
            reads = await asyncio.wait_for(self._upstream.answers_now(), self._lease_s)
        except TimeoutError:
            reads = False
        finally:
            self._checking = False
        if reads:
            logger.info("a peer confirmed this replica cannot reach the upstream, but it answers now: its clients stay")
            return
        self._follow(self._board.moved(self._machine.live))

    def _follow(self, moved: bool) -> None:
        self._metrics.upstream_cut.set(1 if moved else 0)
        if moved == self._moved:
            return
        self._moved = moved
        if moved:
            logger.warning("this replica cannot reach the upstream and another can: moving its clients there")
        else:
            logger.info("this replica serves its clients again")
        for listener in self._listeners:
            listener(moved)
