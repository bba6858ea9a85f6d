"""Each break in this folder must make the tests that pin its invariant fail.

    python -m tests.breaks.run            # every break
    python -m tests.breaks.run 20         # the breaks of invariant 20
    python -m tests.breaks.run 7 17       # several invariants (`7` and `07` alike)

A break is `NN-what-it-breaks.patch`: a small diff against the checkout that breaks design invariant NN.
Each is applied to a scratch copy of the checkout (tracked and untracked files, as they are now), and
`pytest --invariant NN` runs there; the break is *caught* when that run fails. Prints one line a break, and
exits 1 when any break was missed (or did not apply).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BREAKS = Path(__file__).resolve().parent
ROOT = BREAKS.parents[1]
_QUICK_ENV = {"FAIR_SHARE_CHURN_S": "5", "PYTHONDONTWRITEBYTECODE": "1"}
"""Long-running pins shortened: a break shows in their first seconds."""


def _copy(into: Path) -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    tools = ROOT / ".tools"
    if tools.exists():
        (into / ".tools").symlink_to(tools)


def _invariant(patch: Path) -> int:
    return int(patch.name.split("-", 1)[0])


def _run(patch: Path) -> tuple[str, str]:
    invariant = _invariant(patch)
    with tempfile.TemporaryDirectory(prefix="break-") as scratch:
        tree = Path(scratch)
        _copy(tree)
        applied = subprocess.run(["git", "apply", str(patch)], cwd=tree, capture_output=True, text=True)
        if applied.returncode != 0:
            return "did not apply", applied.stderr.strip()
        env = {**os.environ, **_QUICK_ENV, "PYTHONPATH": str(tree)}
        argv = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", f"--invariant={invariant}"]
        tests = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
        lines = tests.stdout.strip().splitlines() or [""]
        summary = lines[-1]
        failed = [line.split()[1] for line in lines if line.startswith("FAILED ")]
        if failed:
            summary = f"{failed[0]}; {summary}"  # the pin that caught it (the run stops at the first failure)
        return ("caught" if tests.returncode == 1 else "MISSED" if tests.returncode == 0 else "error"), summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("invariants", nargs="*", help="only the breaks of these invariants")
    args = parser.parse_args()
    wanted = {int(n) for n in args.invariants}  # `7` and `07` name the same invariant
    patches = sorted(p for p in BREAKS.glob("*.patch") if not wanted or _invariant(p) in wanted)
    missed = 0
    for patch in patches:
        verdict, detail = _run(patch)
        missed += verdict != "caught"
        print(f"{verdict:14} {patch.name}  ({detail})", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
