"""The cast of the Redis bus machine's playbooks: this replica, its peers, and keys each of them wins."""

from __future__ import annotations

from sidecar.bus.commands import BusCommand
from sidecar.bus.events import BusEvent
from sidecar.bus.layout import key_hash
from sidecar.bus.machine import BusMachine
from sidecar.bus.ownership import rendezvous_owner
from sidecar.changes import WatchKey
from tests.kit.playbook import Playbook

__all__ = ["ME", "PEER", "THIRD", "Book", "book", "key_won_by"]

ME, PEER, THIRD = "r-me", "r-peer", "r-third"

Book = Playbook[BusEvent, BusCommand]


def book() -> Book:
    return Playbook(BusMachine(ME), now=1_000.0)


def key_won_by(winner: str, *among: str) -> WatchKey:
    """A key whose rendezvous owner among `winner` and `among` is `winner`."""
    for n in range(1_000):
        key = WatchKey("resource", f"note://{n}", "public")
        if rendezvous_owner((winner, *among), key_hash(key)) == winner:
            return key
    raise AssertionError("no key found")  # pragma: no cover
