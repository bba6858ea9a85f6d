"""A mutmut run of the watch engine checked against its record (docs/mutation.md, docs/mutation-survivors.txt).

    rm -rf mutants && mutmut run --max-children 2 && python -m tests.mutation_record

Fails when the score is under the floor, when a mutant survives that the record does not judge (a new gap in
the tests, or a change that renumbered a function's mutants: either way the record needs its reason), or when
one the record lists no longer survives (killed now, or renamed: the record says what is no longer true). A
mutant the run could not judge (suspicious, a segfault, not checked: a loaded or broken run) is reported as such,
not as a survivor.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "mutation-survivors.txt"
FLOOR = 0.90
"""The least share of mutants killed (timeouts count as killed, as mutmut counts them)."""
_KILLED = frozenset({"killed", "timeout"})
_SURVIVED = "survived"
"""Any other status (suspicious, segfault, not checked, no tests, skipped) is a mutant the run did not judge."""
_VERDICTS = frozenset({"equivalent", "left"})


def recorded(text: str) -> dict[str, str]:
    """The record's survivors and their verdicts (`name verdict` a line; `#` starts a comment)."""
    survivors: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, verdict = line.partition(" ")
        verdict = verdict.strip()
        if verdict not in _VERDICTS:
            raise ValueError(f"{RECORD.name} line {number}: the verdict must be one of {sorted(_VERDICTS)}")
        survivors[name] = verdict
    return survivors


def statuses(results: str) -> dict[str, str]:
    """Each mutant's status from `mutmut results --all true` (`    name: status` a line)."""
    found: dict[str, str] = {}
    for line in results.splitlines():
        name, colon, status = line.strip().rpartition(": ")
        if colon and name.startswith("sidecar."):
            found[name] = status
    return found


def check(found: dict[str, str], record: dict[str, str]) -> list[str]:
    """What is wrong with a run against the record (nothing: an empty list)."""
    if not found:
        return ["no mutants: run `mutmut run` first"]
    survivors = {name for name, status in found.items() if status not in _KILLED}
    score = 1 - len(survivors) / len(found)
    unjudged = {name for name in survivors if found[name] != _SURVIVED}
    survivors -= unjudged
    problems = [f"not judged by this run ({found[name]}): {name}" for name in sorted(unjudged)]
    if score < FLOOR:
        problems.append(f"{score:.1%} of mutants killed, under the floor of {FLOOR:.0%}")
    problems += [f"survives, and the record does not judge it: {name}" for name in sorted(survivors - record.keys())]
    problems += [f"listed in the record, and no longer survives: {name}" for name in sorted(record.keys() - survivors)]
    return problems


def main() -> int:
    results = subprocess.run(
        ["mutmut", "results", "--all", "true"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    found = statuses(results.stdout)
    record = recorded(RECORD.read_text())
    survivors = sum(status not in _KILLED for status in found.values())
    print(f"{len(found) - survivors} of {len(found)} mutants killed, {survivors} survive ({len(record)} in the record)")
    problems = check(found, record)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
