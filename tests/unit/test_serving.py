"""The open-files limit at start: raised to the hard limit, and the client cap lowered to fit where it cannot be.

Each case runs in a child process whose limits are set before it starts, so this process keeps its own.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

from tests.procs import REPO_ROOT

_PROBE = """
import json, logging, resource
from sidecar.config import ListenConfig
from sidecar.serving import raise_open_files_limit
logging.basicConfig(level=logging.INFO)
listen = raise_open_files_limit(ListenConfig(max_connections=12000), 1024)
print(json.dumps([listen.max_connections, resource.getrlimit(resource.RLIMIT_NOFILE)[0]]))
"""


def _start_under(soft: int, hard: int) -> tuple[int, int, str]:
    """(client cap in force, soft limit after start, log) of a start under the open-files limit (soft, hard)."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=30,
        check=True,
    )
    cap, limit = json.loads(done.stdout)
    return cap, limit, done.stderr


def _hard() -> int:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 13024:
        pytest.skip(f"this process's hard open-files limit ({hard}) is below what the case needs")
    return 13024


def test_a_low_soft_limit_is_raised_to_the_hard_one_and_the_cap_kept() -> None:
    cap, limit, log = _start_under(1024, _hard())
    assert (cap, limit) == (12000, 13024)
    assert "lowered" not in log


@pytest.mark.parametrize(("hard", "cap"), [(1024, 512), (4096, 3072), (8192, 7168)])
def test_a_hard_limit_below_the_cap_lowers_the_cap_to_what_it_leaves(hard: int, cap: int) -> None:
    in_force, limit, log = _start_under(hard, hard)
    assert (in_force, limit) == (cap, hard)
    assert "listen.max_connections lowered to fit the open-files limit" in log


def test_a_settled_heap_is_frozen_and_collected_young_less_often() -> None:
    # In a child process: freezing this test process's heap would outlive the test.
    probe = (
        "import gc, json\n"
        "from sidecar.serving import GC_YOUNG_THRESHOLD, settle_heap\n"
        "before = gc.get_threshold()\n"
        "settle_heap()\n"
        "print(json.dumps([before, gc.get_threshold(), gc.get_freeze_count() > 0, GC_YOUNG_THRESHOLD]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    before, after, frozen, young = json.loads(done.stdout)
    assert after == [young, *before[1:]]
    assert frozen
