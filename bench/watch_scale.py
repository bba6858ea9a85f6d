"""What one watch event costs as the watches grow (`python -m bench.watch_scale`): the registry, its engine and the
memory bus, driven as in their tests (a scripted upstream, the hand-moved clock), timed per watch start, per poll
and per watch end, with a few thousand watches and with many more, in one run.

The figure is the ratio of the two: about 1 when nothing in those paths passes over every watch; it grows with the
watches when something does (a gauge that counted the contexts of every watch at each start and end made a start
at 20,000 watches cost several times one at 2,000). A structural figure as much as a timing: compare ratios, not
the absolute times, which are this machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from dataclasses import dataclass

from sidecar.config import PollingConfig
from sidecar.identity import Identity
from sidecar.watch.handles import Handle
from tests.unit.watch.registry_world import World, make_world
from tests.unit.watch.scripted_upstream import contents

_CONFIG = PollingConfig(
    default_interval_ms=5000,
    min_interval_ms=250,
    max_interval_ms=60000,
    jitter=0.0,
    linger_ms=100,
    max_baselines_per_s=1_000_000,
)
"""Every watch polls 5 s after its first look, all at once; one no stream holds ends 0.1 s after its release."""
_CONTEXTS = [Identity(f"ctx-{n}", (("authorization", f"Bearer {n}"),), client=f"client-{n}") for n in range(100)]
_CHUNK = 1000
_SPREAD_S = 0.001


@dataclass
class Costs:
    watches: int
    start_us: float
    poll_us: float
    end_us: float


async def _acquire(world: World, first: int, count: int) -> list[Handle]:
    handles: list[Handle] = []
    for chunk in range(first, first + count, _CHUNK):
        asked = range(chunk, min(chunk + _CHUNK, first + count))
        got = await asyncio.gather(
            *(world.registry.acquire("resource", f"bench://{n}", _CONTEXTS[n % len(_CONTEXTS)]) for n in asked)
        )
        handles.extend(handle for handle in got if handle is not None)
        world.clock.advance(_SPREAD_S)  # each chunk's polls come due a moment after the last's
    return handles


async def measure(watches: int, batch: int) -> Costs:
    """`watches` watches live; then `batch` more start, all poll once, and the `batch` end."""
    world = make_world(_CONFIG, capacity=1_000_000, per_client=1_000_000)
    for n in range(watches + batch):
        world.upstream.resources[f"bench://{n}"] = contents(f"bench://{n}", "v1")
    await _acquire(world, 0, watches)
    gc.collect()  # what earlier measurements left is not collected on this one's time
    started = time.perf_counter()
    added = await _acquire(world, watches, batch)
    start_s = time.perf_counter() - started
    assert len(added) == batch, f"{len(added)} of {batch} watches started"

    world.clock.advance_to(5.0)
    started = time.perf_counter()
    fired = 0
    while fired < watches + batch:  # one chunk's polls at a time
        fired += world.clock.advance(_SPREAD_S)
        await world.clock.until(lambda: world.registry.polls_in_flight == 0, "every poll ended")
    poll_s = time.perf_counter() - started

    world.clock.advance(0.05)
    started = time.perf_counter()
    for handle in added:
        handle.release()
    world.clock.advance(_CONFIG.linger_ms / 1000)
    end_s = time.perf_counter() - started
    assert len(world.registry.watches()) == watches, "the released watches ended"
    await world.registry.aclose()
    return Costs(watches, start_s / batch * 1e6, poll_s / (watches + batch) * 1e6, end_s / batch * 1e6)


async def _run(small: int, large: int, batch: int, rounds: int) -> list[tuple[Costs, Costs]]:
    pairs = []
    for _ in range(rounds):
        pairs.append((await measure(small, batch), await measure(large, batch)))
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=2_000, help="watches live in the baseline")
    parser.add_argument("--large", type=int, default=20_000, help="watches live in the measurement")
    parser.add_argument("--batch", type=int, default=1_000, help="watches started and ended in each")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    pairs = asyncio.run(_run(args.small, args.large, args.batch, args.rounds))
    print(f"| per event (median of {args.rounds}) | {args.small:,} watches | {args.large:,} watches | ratio |")
    print("| --- | --- | --- | --- |")
    for label, field in (("a watch starts", "start_us"), ("a watch polls", "poll_us"), ("a watch ends", "end_us")):
        small = sorted(getattr(pair[0], field) for pair in pairs)[len(pairs) // 2]
        large = sorted(getattr(pair[1], field) for pair in pairs)[len(pairs) // 2]
        print(f"| {label} | {small:.0f} us | {large:.0f} us | {large / small:.2f}x |")


if __name__ == "__main__":
    main()
