"""`mcp-sidecar run --workers 2`: one process tree on one port, its workers sharing changes through Redis, and
all of them gone after SIGTERM to the parent."""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from tests.cluster import (
    RedisServer,
    Replica,
    free_port,
    sidecar_config,
)
from tests.kit import ListenStream, Streams, all_updated, eventually
from tests.peers import Upstream
from tests.procs import START_TIMEOUT_S

URI = "catalog://price"
NOTIFY_WITHIN_S = 10.0
"""Generous bound for a change to reach a stream (an interval, a lease period and a hop through Redis)."""


async def _instance_streams(sidecar: Replica, tries: int = 40) -> dict[str, int]:
    """Open stream count per worker instance, from /status over fresh connections (the kernel picks the worker)."""
    seen: dict[str, int] = {}
    for _ in range(tries):
        status = await sidecar.status()
        seen[status["instance"]] = status["counts"]["streams"]
        if len(seen) >= 2:
            break
    return seen


MAX_WORKER_STREAMS = 64
"""Streams opened at most while waiting for both workers to hold one (2**-63 odds of all on one by chance)."""


def _listening_instances(sidecar: Replica) -> set[str]:
    """The instance ids that logged "mcp-sidecar listening" (one per worker process)."""
    return {entry["instance"] for entry in sidecar.log_lines() if entry.get("msg") == "mcp-sidecar listening"}


def _listening(sidecar: Replica, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return len(_listening_instances(sidecar)) >= count

    return check


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(child) for child in text.split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


async def test_two_workers_on_one_port_share_changes_and_stop_together_on_sigterm(
    tmp_path: Path, shop: Upstream, redis: RedisServer, streams: Streams
) -> None:
    config = sidecar_config(shop.url, free_port(), redis.url)
    sidecar = Replica("workers", tmp_path / "workers", config, extra_args=["--workers", "2"])
    try:
        await sidecar.start()
        workers = _children(sidecar.service.pid)
        assert len(workers) == 2, workers
        # /readyz was answered by whichever worker listened first; until the other listens too, every connection
        # lands on the first. Wait for both to say so rather than count on connections spreading meanwhile.
        await eventually(_listening(sidecar, 2), START_TIMEOUT_S, what="both workers logged that they listen")

        # Streams until both workers hold some: each stream is its own connection, which the kernel hands to one
        # of the two sockets on the port by a hash of its addresses, so a few batches do. The bound only turns a
        # port that never spreads into a failure instead of a hang.
        opened: list[ListenStream] = []
        per_instance: dict[str, int] = {}
        while not (len(per_instance) == 2 and all(per_instance.values())):
            assert len(opened) < MAX_WORKER_STREAMS, f"{len(opened)} streams, all on one worker: {per_instance}"
            opened += await streams.open_many(sidecar.url, f"w{len(opened)}", 4)
            per_instance = await _instance_streams(sidecar)
        assert _listening_instances(sidecar) == set(per_instance), per_instance

        await shop.set_price(160)
        await all_updated(opened, URI, NOTIFY_WITHIN_S)  # detected by the lease holder, delivered by both workers

        await sidecar.service.signal(signal.SIGTERM)
        assert await sidecar.service.wait() == 0, sidecar.service.log_tail()
        await eventually(_none_alive(workers), 5, what="both workers exited after SIGTERM to the parent")
        for stream in opened:  # graceful: each stream ended with the complete result
            final = await stream.wait_for(lambda frame: "result" in frame, NOTIFY_WITHIN_S)
            assert final["result"]["resultType"] == "complete"
    finally:
        await sidecar.service.stop()
    assert "Traceback" not in sidecar.service.log_text()


def _none_alive(pids: Sequence[int]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return not any(_alive(pid) for pid in pids)

    return check
