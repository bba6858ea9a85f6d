"""What the listen tests ask of the sidecar's watches (their polls, how many, which) and what they read in the
upstream's log (its own times: `at` when a request arrived, `done` when it was answered); the streams themselves
are the kit's `ListenStream`."""

from __future__ import annotations

from typing import Any

from sidecar.app import METRICS, REGISTRY
from sidecar.changes import WatchKind
from sidecar.watch.registry import WatchSummary
from tests.kit import WAIT_S, Sidecar, eventually

__all__ = [
    "POLLING",
    "PRICE",
    "PROFILE",
    "TTL_MS",
    "answered",
    "most_in_flight",
    "polled",
    "polls",
    "reads_of",
    "watch_count",
    "watch_polled_twice",
    "watches",
]

TTL_MS = 300
"""read and list ttlMs of the upstreams (`fast_upstream`, tests/conftest.py): the sidecar polls each watch about
every 300 ms."""
POLLING = {"min_interval_ms": 100, "default_interval_ms": TTL_MS, "linger_ms": 100}

PRICE = "catalog://price"
PROFILE = "catalog://profile"


def polls(sidecar: Sidecar, kind: WatchKind) -> float:
    """Successful polls of watches of this kind so far."""
    value: float = sidecar.app[METRICS].polls.labels(kind, "ok")._value.get()
    return value


def watch_count(sidecar: Sidecar, kind: WatchKind) -> float:
    value: float = sidecar.app[METRICS].watches.labels(kind)._value.get()
    return value


def watches(sidecar: Sidecar) -> list[WatchSummary]:
    return list(sidecar.app[REGISTRY].watches())


async def polled(sidecar: Sidecar, kind: WatchKind, times: int) -> None:
    """Wait until the sidecar has polled watches of `kind` `times` more times (from now)."""
    start = polls(sidecar, kind)
    await eventually(lambda: polls(sidecar, kind) >= start + times, within_s=WAIT_S)


async def watch_polled_twice(sidecar: Sidecar, watch: WatchSummary) -> None:
    """Wait until this one watch has finished two more polls (the second started after now)."""

    def last_poll() -> float | None:
        (now,) = [seen for seen in watches(sidecar) if seen.key == watch.key]
        return now.last_poll_at

    for _ in range(2):
        last = last_poll()
        await eventually(lambda: last_poll() != last, within_s=WAIT_S)  # noqa: B023


def reads_of(log: list[dict[str, Any]], uri: str) -> list[dict[str, Any]]:
    return [entry for entry in log if entry["method"] == "resources/read" and entry["uri"] == uri]


def most_in_flight(entries: list[dict[str, Any]]) -> int:
    """The most of these requests the upstream had in hand at once, by its own times (arrived, answered)."""
    edges = sorted([(entry["at"], 1) for entry in entries] + [(entry["done"], -1) for entry in entries])
    most = held = 0
    for _, step in edges:  # an answer at the very time of an arrival counts first (sorted -1 before 1)
        held += step
        most = max(most, held)
    return most


def answered(entries: list[dict[str, Any]]) -> bool:
    return all(entry["done"] is not None for entry in entries)
