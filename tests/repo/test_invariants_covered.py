"""Every invariant of the design (docs: design.md §2: 1 to 24) is pinned by at least one test."""

from __future__ import annotations

import re
from pathlib import Path

INVARIANTS = {*range(1, 25)}
_MARK = re.compile(r"@pytest\.mark\.invariant\((\d+)\)")


def test_each_design_invariant_has_a_test() -> None:
    tests_root = Path(__file__).resolve().parents[1]
    seen = {int(n) for path in tests_root.rglob("test_*.py") for n in _MARK.findall(path.read_text())}
    assert INVARIANTS - seen == set(), f"invariants without a test: {sorted(INVARIANTS - seen)}"
