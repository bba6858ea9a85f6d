"""A rolling update: a replica of the previous version and one of this checkout share one Redis. The key and
message formats did not change, so they agree on who polls, and a change the poller of either version publishes
reaches the streams on the other.

The previous version is the last commit before the Redis bus was rebuilt as collaborators (`PREVIOUS`), its
`sidecar/` taken with `git archive` and run from a folder of its own. Without that commit in the history (a
shallow clone) the test is skipped, and under CI=true that skip fails (CI clones the whole history).
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import aiohttp
import pytest

from sidecar.observability.logs import INSTANCE_ENV
from tests.cluster import RedisServer, Replica, free_port, instances_where_first_polls, leases_held, sidecar_config
from tests.kit import ListenStream, eventually
from tests.peers import Upstream
from tests.prereqs import skip_missing
from tests.procs import REPO_ROOT

PREVIOUS = "ee71d8eebe9cf09fad9e1f945708314cfe02472f"
"""The last commit whose Redis bus was one class cut into an inheritance chain (`RedisCluster`)."""
URI = "catalog://price"
NOTIFY_WITHIN_S = 10.0


@pytest.fixture(scope="module")
def previous_version(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the previous version's `sidecar/` package (its `python -m sidecar.cli` runs from there)."""
    git = shutil.which("git")
    if git is None or not (REPO_ROOT / ".git").exists():
        skip_missing("the previous version of the sidecar needs git and the repository's history")
    found = subprocess.run([git, "cat-file", "-e", f"{PREVIOUS}^{{commit}}"], cwd=REPO_ROOT, capture_output=True)
    if found.returncode != 0:
        skip_missing(f"commit {PREVIOUS[:12]} (the previous version) is not in this clone's history: a full clone")
    archive = subprocess.run([git, "archive", "--format=tar", PREVIOUS, "sidecar"], cwd=REPO_ROOT, capture_output=True)
    assert archive.returncode == 0, archive.stderr.decode()
    root = tmp_path_factory.mktemp("previous-version")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(root, filter="data")
    assert (root / "sidecar" / "bus" / "coordinator.py").exists(), "not the version before the bus's collaborators"
    return root


@pytest.mark.parametrize("poller", ["previous", "current"])
async def test_a_replica_of_each_version_agree_on_the_poller_and_a_change_reaches_the_others_streams(
    tmp_path: Path,
    shop: Upstream,
    redis: RedisServer,
    http: aiohttp.ClientSession,
    previous_version: Path,
    poller: str,
) -> None:
    names = instances_where_first_polls(URI, 2)  # the first name is the one rendezvous hashing picks
    versions = [poller, "current" if poller == "previous" else "previous"]
    replicas = []
    for name, version in zip(names, versions, strict=True):
        config = sidecar_config(shop.url, free_port(), redis.url)
        replica = Replica(f"{version}-{name}", tmp_path / name, config, env={INSTANCE_ENV: name})
        if version == "previous":
            replica.service.cwd = previous_version
        replicas.append(replica)
    streams: list[ListenStream] = []
    try:
        for replica in replicas:
            await replica.start()
        streams = [await ListenStream.connect(http, replica.url, replica.name, [URI]) for replica in replicas]

        async def one_poller() -> bool:
            return await leases_held(replicas) == [1, 0]

        await eventually(one_poller, NOTIFY_WITHIN_S, what=f"the {poller} version's replica alone polls the key")
        marks = [stream.mark() for stream in streams]
        await shop.set_price(150)
        for stream, mark in zip(streams, marks, strict=True):
            await stream.wait_update(URI, NOTIFY_WITHIN_S, since=mark)
    finally:
        for stream in streams:
            await stream.aclose()
        for replica in replicas:
            await replica.service.stop()
