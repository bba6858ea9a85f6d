"""The break record (docs/breaks.md) stays runnable: every break still applies to the code it breaks.

A change that moves the code a break edits makes that break stale; this fails at once, in every run, instead
of at the next run of the whole record. (Whether each break is still caught is the record's own run.)
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.breaks.run import BREAKS, ROOT

PATCHES = sorted(BREAKS.glob("*.patch"))


def test_the_record_has_a_break_for_every_invariant_it_names() -> None:
    invariants = {int(patch.name.split("-", 1)[0]) for patch in PATCHES}
    assert invariants == {*range(1, 25)}, "design.md's invariants 1 to 24, each with a break"


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
@pytest.mark.parametrize("patch", PATCHES, ids=[patch.stem for patch in PATCHES])
def test_each_break_applies_to_the_checkout(patch: Path) -> None:
    checked = subprocess.run(["git", "apply", "--check", str(patch)], cwd=ROOT, capture_output=True, text=True)
    assert checked.returncode == 0, f"remake {patch.name} against the code as it is now: {checked.stderr}"
