"""Who polls a key: rendezvous (highest-random-weight) hashing over the live replicas interested in it that can read
the upstream.

Pure bookkeeping, no I/O: the Redis coordinator feeds it the live replicas (from heartbeats), each key's interested
replicas (read when this replica's interest arrives, then kept current by the bucket's interest messages) and the
replicas cut from the upstream (those a peer that reads confirmed, `sidecar.bus.readers`), and asks it what this
replica owns. Every replica that holds the same inputs picks the same owner; one joining or leaving moves only the
keys it wins or held, about 1/N of them; one cut from the upstream gives its keys to the interested replicas that
can read, and keeps those none of them is interested in (invariant 23). With nobody cut, nothing changes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["Ownership", "rendezvous_owner", "weight"]


def weight(instance: str, hashed: str) -> int:
    """The instance's draw for the key: independent per (instance, key), the same on every replica."""
    digest = hashlib.blake2b(f"{instance}\0{hashed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_owner(candidates: Iterable[str], hashed: str) -> str | None:
    """The candidate with the highest draw (ties, which need a 64-bit collision, go to the greater name)."""
    best: tuple[int, str] | None = None
    for instance in candidates:
        draw = (weight(instance, hashed), instance)
        if best is None or draw > best:
            best = draw
    return None if best is None else best[1]


class Ownership:
    """The keys this replica tracks (by hash), who else is interested in each, and which of them it owns.

    Every mutator returns the keys this replica gained and lost by it. This replica counts as live for itself
    whatever the heartbeats say: a late heartbeat of its own must not leave its keys unpolled.
    """

    def __init__(self, me: str) -> None:
        self.me = me
        self._live: frozenset[str] = frozenset({me})
        self._cut: frozenset[str] = frozenset()
        self._interest: dict[str, set[str]] = {}
        self._owned: set[str] = set()

    @property
    def owned(self) -> frozenset[str]:
        return frozenset(self._owned)

    @property
    def live(self) -> frozenset[str]:
        return self._live

    def owns(self, hashed: str) -> bool:
        return hashed in self._owned

    def interested(self, hashed: str) -> frozenset[str]:
        return frozenset(self._interest.get(hashed, ()))

    def track(self, hashed: str, members: Iterable[str]) -> tuple[set[str], set[str]]:
        """This replica's interest in the key is registered; `members` is who else Redis says is interested."""
        self._interest[hashed] = {*members, self.me}
        return self._settle([hashed])

    def untrack(self, hashed: str) -> tuple[set[str], set[str]]:
        """No local interest left: this replica neither polls it nor follows its interest."""
        self._interest.pop(hashed, None)
        lost = {hashed} if hashed in self._owned else set()
        self._owned.discard(hashed)
        return set(), lost

    def interest(self, hashed: str, instance: str, present: bool) -> tuple[set[str], set[str]]:
        """Another replica's interest in a key arrived or left (a bucket's interest message)."""
        members = self._interest.get(hashed)
        if members is None or instance == self.me:
            return set(), set()
        if present:
            members.add(instance)
        else:
            members.discard(instance)
        return self._settle([hashed])

    def set_live(self, live: Iterable[str]) -> tuple[set[str], set[str]]:
        """The live replicas, from the latest heartbeat read. One missing is not forgotten: a replica late with
        its heartbeat comes back with the interest it had (`forget` is for the dead whose entries are gone)."""
        new = frozenset({*live, self.me})
        if new == self._live:
            return set(), set()
        self._live = new
        return self._settle(self._interest)

    def set_cut(self, cut: Iterable[str]) -> tuple[set[str], set[str]]:
        """The replicas cut from the upstream (a peer that reads confirmed it): each key they would own goes to the
        next of its interested live replicas that is not cut, when there is one."""
        new = frozenset(cut)
        if new == self._cut:
            return set(), set()
        self._cut = new
        return self._settle(self._interest)

    def forget(self, instance: str) -> None:
        """A dead replica's interest was removed from Redis: it leaves every key's interest here too."""
        if instance == self.me:
            return
        for members in self._interest.values():
            members.discard(instance)

    def _settle(self, hashes: Iterable[str]) -> tuple[set[str], set[str]]:
        gained: set[str] = set()
        lost: set[str] = set()
        live, cut = self._live, self._cut
        for hashed in hashes:
            members = self._interest.get(hashed)
            candidates = [m for m in members if m in live] if members else []
            # Among those that can read, when one of them is interested; else as if nobody were cut (an outage for
            # all moves nothing).
            readers = [m for m in candidates if m not in cut] if cut else candidates
            owner = rendezvous_owner(readers or candidates, hashed)
            if owner == self.me:
                if hashed not in self._owned:
                    self._owned.add(hashed)
                    gained.add(hashed)
            elif hashed in self._owned:
                self._owned.discard(hashed)
                lost.add(hashed)
        return gained, lost
