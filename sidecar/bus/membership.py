"""This replica among the replicas on Redis: its heartbeats (which read the live set), the claim and clean-up of
replicas whose heartbeat ran out, and leaving.
"""

from __future__ import annotations

import orjson

from sidecar.bus.connect import REDIS_FAILURES, Op
from sidecar.bus.layout import HINTS_CHANNEL, READERS, REPLICAS, Interest, encode_interest, text
from sidecar.bus.link import Link
from sidecar.bus.machine import Beat, CleanUpEnded, Decide, InterestRemoved
from sidecar.tasks import TaskSet

__all__ = ["DEFAULT_LEASE_MS", "Membership"]

DEFAULT_LEASE_MS = 5_000
_CLEAN_UP_FAILURES: tuple[type[Exception], ...] = (*REDIS_FAILURES, ValueError)


class Membership:
    """Heartbeats, clean-ups of the dead, and leaving: the Redis calls, made as the bus's machine decides (it is
    fed what each heartbeat reads, and says which dead replicas to clean up)."""

    def __init__(self, link: Link, background: TaskSet, decide: Decide, *, lease_ms: int) -> None:
        self._link = link
        self._background = background
        self._decide = decide
        self._lease_ms = lease_ms

    @property
    def beat_every_s(self) -> float:
        """A heartbeat every third of a lease: two may be late before the others take this replica for dead."""
        return self._lease_ms / 3000

    async def join(self) -> None:
        """A process restarted under the same name (MCP_SIDECAR_INSTANCE) forgets its predecessor's interest
        first; then it is live before any interest of ours is read by others."""
        await self.clean_up(self._link.instance, restarted=True)
        await self.beat()

    async def beat(self) -> None:
        live, dead, added = await self._link.scripts.heartbeat(
            keys=[REPLICAS], args=[self._link.instance, self._lease_ms]
        )
        self._decide(Beat(frozenset(text(m) for m in live), tuple(text(m) for m in dead), bool(int(added))))

    def clean_up_soon(self, instance: str) -> None:
        """A dead replica's clean-up, in the background (the machine starts one at a time per replica)."""
        self._background.spawn(self._clean_up_once(instance))

    async def _clean_up_once(self, instance: str) -> None:
        try:
            await self.clean_up(instance)
        finally:
            self._decide(CleanUpEnded(instance))

    async def claim(self, instance: str) -> bool:
        """Claim a dead replica's clean-up, only while it is still dead (see `scripts.CLAIM`)."""
        return bool(await self._link.scripts.claim(keys=[REPLICAS], args=[instance, self._lease_ms]))

    async def clean_up(self, instance: str, *, restarted: bool = False) -> None:
        """A replica's heartbeat ran out (or it restarted under its name): its interest leaves Redis, each
        removal told on its bucket (the others ignore a dead replica already; a restarted one is live).

        A dead one is claimed first, and only while still dead (see `scripts.CLAIM`): one that beat again since
        it was listed (it was only slow) keeps its place, its interest and its keys. It leaves the replicas
        last, so one that beats after this finds itself unlisted and writes its interest again (whatever a
        removal here met of it); a clean-up cut short (an error, this replica closing) leaves its claim to run
        out, and the next heartbeat that lists it dead tries again."""
        layout, client = self._link.layout, self._link.client
        try:
            if not restarted and not await self.claim(instance):
                return  # live again, or someone else cleans it up
            index = layout.interest_of(instance)
            entries = [text(entry) for entry in await client.smembers(index)]
            ops = []
            for entry in entries:
                bucket_text, _, hashed = entry.partition(":")
                bucket = int(bucket_text)
                keys = [layout.interest(bucket, hashed), layout.channel(bucket)]
                message = encode_interest(Interest(instance, hashed, False))
                ops.append(Op(self._link.scripts.leave, keys, [instance, *self._link.publish_args(message)]))
            # Its declaration that it cannot read the upstream leaves too (a restarted one has not said it yet).
            told = orjson.dumps({"o": self._link.instance, "c": [], "r": {"i": instance, "v": None}})
            ops.append(Op(self._link.scripts.declare, [READERS], [instance, "", "", HINTS_CHANNEL, told]))
            await self._link.batch(ops)
            await client.delete(index)
            self._decide(InterestRemoved(instance))
            await client.zrem(REPLICAS, instance)
        except _CLEAN_UP_FAILURES:
            pass  # its claim (if taken) runs out: the next heartbeat that lists it dead tries again

    async def leave(self) -> None:
        """Gone from the live replicas, and the others hear it (each key we polled gets its next owner now
        rather than when our heartbeat runs out). Our interest is the interest writer's to remove, first."""
        client, instance = self._link.client, self._link.instance
        await client.zrem(REPLICAS, instance)
        await client.delete(self._link.layout.interest_of(instance))
        await client.publish(HINTS_CHANNEL, orjson.dumps({"o": instance, "left": True}))
