"""`python -m bench.warm`: how soon a hint sent at a write is told when the source shows the write late, and what
the warm schedule costs in reads, with `hints.settle_ms` at 3000 (the default) and 0 (one look a hint).

The sidecar's own watch engine (registry, schedule, poll plans) runs on a simulated clock against a scripted
upstream that shows each write `lag` seconds after it is made (as basic-memory shows a saved note 0.3 to 1 s
later, once re-indexed). The watch polls every 30 s; each round hints the key at the write, as a save hook
would, and measures the write to its change event (what every stream holding the key is told), and the reads
the upstream counted from the hint until then. `lag` none: nothing was written (a false alarm: the reads until its
schedule is over).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
from dataclasses import dataclass
from typing import Any, cast

from sidecar.bus.memory import MemoryBus
from sidecar.changes import ChangeEvent
from sidecar.config import PollingConfig
from sidecar.fair_share import FairShare
from sidecar.identity import ANONYMOUS_IDENTITY, Identity
from sidecar.observability.metrics import Metrics
from sidecar.upstream.base import Upstream
from sidecar.watch.registry import WatchRegistry
from sidecar.watch.source_hints import SourceHint
from tests.unit.watch.manual_clock import ManualClock, run_polls
from tests.unit.watch.scripted_upstream import ScriptedUpstream, contents

URI = "bench://note"
INTERVAL_MS = 30_000
LAGS: tuple[float | None, ...] = (0.3, 0.6, 1.0, 1.5, 2.5, 4.0, None)
SETTLES = (3000, 0)
ROUNDS = 20
ROUND_S = 60.0
"""Each round's hint comes this long after the last (past its schedule and one regular poll)."""


@dataclass(frozen=True)
class Row:
    lag_s: float | None
    settle_ms: int
    median_s: float
    worst_s: float
    reads: float
    """Reads from the hint until the change was told (a false alarm: until its schedule was over), on average."""


class _Lagging(ScriptedUpstream):
    """Shows the latest write `lag_s` after it was made; counts its reads."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock
        self.read_count = 0
        self.pending: tuple[float, str] | None = None

    def write(self, text: str, lag_s: float) -> None:
        self.pending = (self.clock.now() + lag_s, text)

    async def call(self, method: str, params: dict[str, Any], identity: Identity) -> dict[str, Any]:
        if method == "resources/read":
            self.read_count += 1
            if self.pending is not None and self.clock.now() >= self.pending[0]:
                self.resources[URI] = contents(URI, self.pending[1], ttlMs=INTERVAL_MS)
                self.pending = None
        return await super().call(method, params, identity)


async def _run(lag_s: float | None, settle_ms: int, seed: int) -> Row:
    config = PollingConfig(default_interval_ms=INTERVAL_MS, max_interval_ms=INTERVAL_MS)
    clock = ManualClock()
    upstream = _Lagging(clock)
    upstream.resources[URI] = contents(URI, "v0", ttlMs=INTERVAL_MS)
    bus, metrics = MemoryBus(), Metrics()
    fair = FairShare(capacity=64, per_client=64, max_queued_per_client=1000, metrics=metrics)
    registry = WatchRegistry(
        cast(Upstream, upstream), config, bus, metrics, fair, clock=clock, hint_settle_ms=settle_ms
    )
    told: list[float] = []

    def heard(event: ChangeEvent) -> None:
        if not event.baseline:
            told.append(clock.now())

    bus.subscribe(heard)
    rng = random.Random(seed)
    waits: list[float] = []
    reads: list[int] = []

    def polling() -> int:
        return registry.polls_in_flight

    try:
        await registry.acquire("resource", URI, ANONYMOUS_IDENTITY)
        for n in range(ROUNDS):
            await run_polls(clock, ROUND_S + rng.uniform(0, INTERVAL_MS / 1000), polling)  # anywhere in the interval
            written, before, counted = clock.now(), len(told), upstream.read_count
            if lag_s is not None:
                upstream.write(f"v{n + 1}", lag_s)
            registry.hearing.source(SourceHint((URI,)))
            # Until the change is told (or, for a false alarm, its schedule is over).
            step = 0.05
            while len(told) == before and clock.now() - written < (settle_ms / 1000 + 1.0 if lag_s is None else 40):
                await run_polls(clock, step, polling)
            if lag_s is not None:
                waits.append(told[before] - written if len(told) > before else float("inf"))
            await run_polls(clock, settle_ms / 1000 + 1.0 - (clock.now() - written), polling)
            reads.append(upstream.read_count - counted)
    finally:
        await registry.aclose()
    median = statistics.median(waits) if waits else float("nan")
    worst = max(waits) if waits else float("nan")
    return Row(lag_s, settle_ms, median, worst, statistics.mean(reads))


async def measure(seed: int = 1) -> list[Row]:
    return [await _run(lag, settle, seed) for lag in LAGS for settle in SETTLES]


def table(rows: list[Row]) -> str:
    lines = [
        "| source's lag | hints.settle_ms | write to told, median | worst | reads, hint to told |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lag = "nothing written" if row.lag_s is None else f"{row.lag_s:g} s"
        told = "" if row.lag_s is None else f"{row.median_s:.2f} s"
        worst = "" if row.lag_s is None else f"{row.worst_s:.2f} s"
        lines.append(f"| {lag} | {row.settle_ms} | {told} | {worst} | {row.reads:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.warm", description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    rows = asyncio.run(measure())
    print(f"one watch polled every {INTERVAL_MS // 1000} s, {ROUNDS} hints a row, each at a write (simulated clock)")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
