"""A server process driven from plain (synchronous) functions: hypothesis runs a property from a plain function,
so the fuzz target is spawned with `subprocess`, polled until its port answers, and read (memory, JSON log lines,
a metric) without an event loop. Its output goes to a log file that a failure quotes."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.kit.metrics import parse
from tests.procs import REPO_ROOT, START_TIMEOUT_S, child_env

__all__ = ["Process", "spawn", "wait_http"]


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not ready:\n{log.read_text(errors='replace')}")
        time.sleep(0.05)  # polling a port that has no event to await, bounded


@dataclass
class Process:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    admin_port: int
    baseline_rss: int = 0
    """Resident memory after start-up and a warm-up of ordinary requests."""

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def log_entries(self) -> list[dict[str, Any]]:
        entries = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                entries.append(json.loads(line))
            except ValueError:
                entries.append({"level": "raw", "msg": line})  # not one of our JSON lines: a traceback, say
        return entries

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/metrics", timeout=5) as resp:
            value = parse(resp.read().decode()).value(name)
        assert value is not None, f"{name} not exposed"
        return value


@contextlib.contextmanager
def spawn(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    # Synchronous, unlike tests.procs: hypothesis drives a property test from a plain function.
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, env=child_env())
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
