"""`python -m bench.budget [--quick]`: what a read budget costs in staleness, no budget against uniform and
adaptive at the same budgets, in one run.

The sidecar's own watch engine (registry, schedule, allocator, budget slots) runs on a simulated clock against a
scripted upstream that counts its reads: no network and no machine speed in the figures, so runs compare. A
tenth of the keys change every second or two, a third about every half minute, the rest never (Poisson, each
key its own pace); every key's upstream answers ttlMs 1 s. Staleness: a change at the source to its change
event (what every stream holding the key is told). Reads: what the upstream counted, a second.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from sidecar.bus.memory import MemoryBus
from sidecar.changes import ChangeEvent
from sidecar.config import PollingConfig
from sidecar.fair_share import FairShare
from sidecar.identity import ANONYMOUS_IDENTITY, Identity
from sidecar.observability.metrics import Metrics
from sidecar.upstream.base import Upstream
from sidecar.watch.registry import WatchRegistry
from tests.unit.watch.manual_clock import ManualClock, run_polls
from tests.unit.watch.scripted_upstream import ScriptedUpstream, contents

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
PLOT = Path(__file__).resolve().parent / "budget_staleness.png"
STEP_S = 0.05


@dataclass(frozen=True)
class Size:
    keys: int
    seconds: float
    warmup_s: float
    budgets: tuple[float, ...]


QUICK = Size(keys=200, seconds=40.0, warmup_s=10.0, budgets=(20.0,))
FULL = Size(keys=600, seconds=150.0, warmup_s=30.0, budgets=(15.0, 30.0, 60.0, 120.0))


@dataclass(frozen=True)
class Row:
    policy: str
    budget: float
    reads_per_s: float
    mean_s: float
    p90_s: float
    changes: int


class _Counting(ScriptedUpstream):
    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock
        self.read_count = 0

    async def call(self, method: str, params: dict[str, Any], identity: Identity) -> dict[str, Any]:
        if method == "resources/read":
            self.read_count += 1
        return await super().call(method, params, identity)


def _paces(keys: int, rng: random.Random) -> list[float | None]:
    """Each key's mean seconds between changes (None: never)."""
    hot, warm = keys // 10, keys // 3
    return [rng.uniform(1.0, 2.0) for _ in range(hot)] + [30.0] * warm + [None] * (keys - hot - warm)


async def _run(size: Size, policy: str, budget: float, seed: int) -> Row:
    rng = random.Random(seed)
    config = PollingConfig(
        default_interval_ms=1000,
        min_interval_ms=250,
        max_interval_ms=60_000,
        max_baselines_per_s=100_000,
        max_reads_per_s=budget if policy != "none" else 0,
        allocation="uniform" if policy == "uniform" else "adaptive",
    )
    clock = ManualClock()
    upstream = _Counting(clock)
    bus, metrics = MemoryBus(), Metrics()
    fair = FairShare(capacity=64, per_client=64, max_queued_per_client=100_000, metrics=metrics)
    registry = WatchRegistry(cast(Upstream, upstream), config, bus, metrics, fair, clock=clock)
    told: dict[str, list[float]] = {}

    def heard(event: ChangeEvent) -> None:
        if not event.baseline and event.key.uri is not None:
            told.setdefault(event.key.uri, []).append(clock.now())

    bus.subscribe(heard)
    uris = [f"bench://key/{n}" for n in range(size.keys)]
    paces = _paces(size.keys, rng)
    version = dict.fromkeys(uris, 0)
    for uri in uris:
        upstream.resources[uri] = contents(uri, "0", ttlMs=1000)
        await registry.acquire("resource", uri, ANONYMOUS_IDENTITY)
    next_change = {uri: rng.expovariate(1 / pace) for uri, pace in zip(uris, paces, strict=True) if pace is not None}
    changed: list[tuple[str, float]] = []
    reads_at_warmup = 0
    try:
        while clock.now() < size.seconds:
            now = clock.now()
            if reads_at_warmup == 0 and now >= size.warmup_s:
                reads_at_warmup = upstream.read_count or 1
            for uri, due in next_change.items():
                if due <= now:
                    version[uri] += 1
                    upstream.resources[uri] = contents(uri, str(version[uri]), ttlMs=1000)
                    if now >= size.warmup_s:
                        changed.append((uri, now))
                    pace = paces[int(uri.rsplit("/", 1)[1])]
                    assert pace is not None
                    next_change[uri] = now + rng.expovariate(1 / pace)
            await run_polls(clock, STEP_S, lambda: registry.polls_in_flight)
        measured_s = clock.now() - size.warmup_s
        reads = upstream.read_count - reads_at_warmup
        waits = []
        for uri, at in changed:
            later = [t for t in told.get(uri, ()) if t >= at]
            waits.append((later[0] if later else clock.now()) - at)  # not yet told: counted as waited so far
    finally:
        await registry.aclose()
    waits.sort()
    return Row(
        policy,
        budget,
        reads / measured_s,
        statistics.mean(waits),
        waits[int(0.9 * (len(waits) - 1))],
        len(waits),
    )


async def measure(size: Size, seed: int = 1) -> list[Row]:
    rows = [await _run(size, "none", 0.0, seed)]
    for budget in size.budgets:
        for policy in ("uniform", "adaptive"):
            rows.append(await _run(size, policy, budget, seed))
    return rows


def table(rows: list[Row]) -> str:
    lines = [
        "| allocation | budget (reads/s) | upstream reads/s | mean staleness | p90 staleness | adaptive/uniform mean |",
        "|---|---|---|---|---|---|",
    ]
    uniform = {row.budget: row.mean_s for row in rows if row.policy == "uniform"}
    for row in rows:
        ratio = f"{row.mean_s / uniform[row.budget]:.2f}" if row.policy == "adaptive" else ""
        budget = "none" if row.policy == "none" else f"{row.budget:g}"
        lines.append(
            f"| {row.policy} | {budget} | {row.reads_per_s:.1f} | {row.mean_s:.2f} s | {row.p90_s:.2f} s | {ratio} |"
        )
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, marker in (("uniform", "s"), ("adaptive", "o")):
        mine = [row for row in rows if row.policy == policy]
        ax.plot([r.reads_per_s for r in mine], [r.mean_s for r in mine], marker=marker, label=f"{policy}, mean")
        ax.plot([r.reads_per_s for r in mine], [r.p90_s for r in mine], marker=marker, ls="--", label=f"{policy}, p90")
    none = next(row for row in rows if row.policy == "none")
    ax.scatter([none.reads_per_s], [none.mean_s], marker="*", s=120, color="k", label="no budget, mean")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("upstream reads per second (counted by the upstream)")
    ax.set_ylabel("staleness: change at the source to change event (s)")
    ax.set_title("Read budget: staleness against reads")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.budget", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one budget, fewer keys, 40 s simulated (a few s)")
    parser.add_argument("--write", action="store_true", help="write the plot and print the RESULTS.md table")
    args = parser.parse_args(argv)
    size = QUICK if args.quick else FULL
    rows = asyncio.run(measure(size))
    print(f"{size.keys} keys, {size.seconds:g} s simulated ({size.warmup_s:g} s warm-up not counted)")
    print(table(rows))
    if args.write:
        plot(rows, PLOT)
        print(f"wrote {PLOT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
