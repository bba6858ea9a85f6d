"""A mutmut run checked against its record (docs/mutation.md, docs/mutation-survivors.txt).

    rm -rf mutants && mutmut run --max-children 2 && python -m tests.mutation_record
    python -m tests.mutation_record --write      # the record from this run, keeping the verdicts it had
    python -m tests.mutation_record sidecar.fair_share sidecar.protocol   # only these modules' mutants

A run of some modules only (`mutmut run 'sidecar.fair_share*'`) is checked with those modules named: the mutants
of the others were not run, and their lines of the record are neither checked nor, with `--write`, rewritten.

A survivor is recorded by its function and its change (the line mutmut removed and the one it put instead),
not by its number: mutmut numbers a function's mutants in order, so any edit of that function renumbers them,
while its change stays the same until the mutated line itself changes.

Fails when the score is under the floor, when a mutant survives that the record does not judge (a new gap in
the tests, or a mutated line that changed: either way the record needs its reason), or when a change the record
lists no longer survives (killed now: the record says what is no longer true). A mutant the run could not judge
(suspicious, a segfault, not checked: a loaded or broken run) is reported as such, not as a survivor.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "mutation-survivors.txt"
FLOOR = 0.90
"""The least share of mutants killed (timeouts count as killed, as mutmut counts them)."""
_KILLED = frozenset({"killed", "timeout"})
_SURVIVED = "survived"
"""Any other status (suspicious, segfault, not checked, no tests, skipped) is a mutant the run did not judge."""
_VERDICTS = ("equivalent", "left")
_UNJUDGED = "?"
_HEADER = """\
# Every mutant of the mutated modules that a fresh `mutmut run` leaves alive, with its verdict: equivalent (no
# input tells it from the code) or left (a real difference judged not worth a test); docs/mutation.md says why, mutant
# by mutant. One a line, tab-separated: the function, the verdict, the line mutmut removed, the line it put
# instead. `python -m tests.mutation_record` checks a run against this list; `--write` rewrites it from a run,
# keeping the verdicts it had and marking new survivors `?` until judged.
"""

Change = tuple[str, str, str]
"""A mutant as the record knows it: its function, the line removed, the line put instead (both stripped)."""
_MODULE = re.compile(r"^(.*?)\.x(?:_|ǁ)")
"""A mutant's or function's module: mutmut names functions `x_name` and methods `xǁClassǁname` within it."""


def module_of(name: str) -> str:
    """The dotted module a mutant or recorded function is in (`sidecar.watch.budget`)."""
    match = _MODULE.match(name)
    return match.group(1) if match else name.rpartition(".")[0]


def in_scope(name: str, modules: Sequence[str]) -> bool:
    """Whether a mutant or recorded function is in one of `modules` or a package under one; every one when none."""
    module = module_of(name)
    return not modules or any(module == scope or module.startswith(scope + ".") for scope in modules)


def recorded(text: str) -> dict[Change, str]:
    """The record's survivors and their verdicts."""
    survivors: dict[Change, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 4:
            raise ValueError(f"{RECORD.name} line {number}: four tab-separated fields (function, verdict, -, +)")
        function, verdict, removed, added = fields
        if verdict not in (*_VERDICTS, _UNJUDGED):
            raise ValueError(f"{RECORD.name} line {number}: the verdict must be one of {[*_VERDICTS, _UNJUDGED]}")
        survivors[(function, removed, added)] = verdict
    return survivors


def statuses(results: str) -> dict[str, str]:
    """Each mutant's status from `mutmut results --all true` (`    name: status` a line)."""
    found: dict[str, str] = {}
    for line in results.splitlines():
        name, colon, status = line.strip().rpartition(": ")
        if colon and name.startswith("sidecar."):
            found[name] = status
    return found


def change_of(name: str, diff: str) -> Change:
    """A mutant's change from its name and `mutmut show`'s diff of it."""
    removed = [line[1:].strip() for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return name.rpartition("__mutmut_")[0], " / ".join(removed), " / ".join(added)


def check(found: dict[str, str], changes: dict[str, Change], record: dict[Change, str]) -> list[str]:
    """What is wrong with a run (`found`: each mutant's status; `changes`: each survivor's) against the record."""
    if not found:
        return ["no mutants: run `mutmut run` first"]
    alive = {name for name, status in found.items() if status not in _KILLED}
    unjudged = sorted(name for name in alive if found[name] != _SURVIVED)
    problems = [f"not judged by this run ({found[name]}): {name}" for name in unjudged]
    score = 1 - len(alive) / len(found)
    if score < FLOOR:
        problems.append(f"{score:.1%} of mutants killed, under the floor of {FLOOR:.0%}")
    survivors = Counter(changes[name] for name in alive if found[name] == _SURVIVED)
    problems += [
        f"survives, and the record does not judge it: {_shown(change)}"
        for change in sorted(survivors)
        if record.get(change, _UNJUDGED) == _UNJUDGED
    ]
    problems += [
        f"listed in the record, and no longer survives: {_shown(change)}"
        for change in sorted(record.keys() - survivors.keys())
    ]
    return problems


def written(
    changes: dict[str, Change], found: dict[str, str], record: dict[Change, str], modules: Sequence[str] = ()
) -> str:
    """The record of this run's survivors, with the verdicts `record` had for the same changes; with `modules`,
    the run was of those only, and the record's lines for the others stay as they are."""
    survivors = {changes[name] for name, status in found.items() if status == _SURVIVED}
    others = {change for change in record if not in_scope(change[0], modules)} if modules else set()
    lines = [
        "\t".join((function, record.get((function, removed, added), _UNJUDGED), removed, added))
        for function, removed, added in sorted(survivors | others)
    ]
    return _HEADER + "\n" + "\n".join(lines) + "\n"


def scores(found: dict[str, str]) -> list[str]:
    """Each module's line of docs/mutation.md's table: killed / timeout / survived / no tests, and the score."""
    by_module: dict[str, Counter[str]] = {}
    for name, status in found.items():
        by_module.setdefault(module_of(name), Counter())[status] += 1
    lines = []
    for module, counts in sorted(by_module.items()):
        total = sum(counts.values())
        killed = counts["killed"] + counts["timeout"]
        lines.append(
            f"{module}: {counts['killed']} / {counts['timeout']} / {counts[_SURVIVED]} / {counts['no tests']}"
            f" of {total}: {killed / total:.1%}"
        )
    return lines


def _shown(change: Change) -> str:
    function, removed, added = change
    return f"{function}: `{removed}` -> `{added}`"


def _mutmut(*args: str) -> str:
    return subprocess.run(["mutmut", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def main(argv: list[str]) -> int:
    write, modules = "--write" in argv, [arg for arg in argv if arg != "--write"]
    every = statuses(_mutmut("results", "--all", "true"))
    found = {name: status for name, status in every.items() if in_scope(name, modules)}
    changes = {name: change_of(name, _mutmut("show", name)) for name, status in found.items() if status == _SURVIVED}
    record = recorded(RECORD.read_text()) if RECORD.exists() else {}
    if write:
        RECORD.write_text(written(changes, found, record, modules))
        print(f"wrote {RECORD.relative_to(ROOT)}: {len(changes)} survivors of {', '.join(modules) or 'every module'}")
        return 0
    record = {change: verdict for change, verdict in record.items() if in_scope(change[0], modules)}
    print("\n".join(scores(found)))
    alive = sum(status not in _KILLED for status in found.values())
    print(f"{len(found) - alive} of {len(found)} mutants killed, {alive} alive ({len(record)} in the record)")
    problems = check(found, changes, record)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
