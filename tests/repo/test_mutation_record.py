"""The mutation record's check (`python -m tests.mutation_record`), and the record itself, stay sound."""

from __future__ import annotations

import pytest

from tests.mutation_record import RECORD, change_of, check, in_scope, module_of, recorded, scores, statuses, written

RESULTS = """
    sidecar.watch.poller.xǁWatchǁhint__mutmut_1: survived
    sidecar.watch.poller.xǁWatchǁhint__mutmut_2: killed
    sidecar.watch.native.x__close__mutmut_1: timeout
"""
DIFF = """# sidecar.watch.poller.xǁWatchǁhint__mutmut_1: survived
--- sidecar/watch/poller.py
+++ sidecar/watch/poller.py
@@ -2,7 +2,7 @@
     allows; hints coalesce.\"\"\"
-    if links and len(self._links) < MAX_LINKS:
+    if links or len(self._links) < MAX_LINKS:
         self._links.extend(links[: MAX_LINKS - len(self._links)])
"""
HINT = (
    "sidecar.watch.poller.xǁWatchǁhint",
    "if links and len(self._links) < MAX_LINKS:",
    "if links or len(self._links) < MAX_LINKS:",
)
MANY_KILLED = {f"sidecar.watch.x.y__mutmut_{n}": "killed" for n in range(20)}


def test_the_committed_record_judges_each_survivor_of_the_engine() -> None:
    record = recorded(RECORD.read_text())
    assert record, "the record lists the survivors of the last fresh run"
    assert all(
        function.startswith(
            (
                "sidecar.watch.",
                "sidecar.changes.",
                "sidecar.backoff.",
                "sidecar.tasks.",
                "sidecar.protocol.frames.",
                "sidecar.protocol.envelope.",
                "sidecar.fair_share.",
                "sidecar.identity.",
                "sidecar.downstream.listen.",
                "sidecar.downstream.listen_stream.",
                "sidecar.downstream.listen_filter.",
                "sidecar.downstream.pending.",
                "sidecar.downstream.legacy_session.",
                "sidecar.downstream.readthrough.",
                "sidecar.bus.machine.",
                "sidecar.bus.ownership.",
            )
        )
        for function, _, _ in record
    )
    assert set(record.values()) <= {"equivalent", "left"}, "every survivor judged"


def test_a_survivor_is_known_by_its_function_and_change_not_its_number() -> None:
    assert change_of("sidecar.watch.poller.xǁWatchǁhint__mutmut_1", DIFF) == HINT
    assert change_of("sidecar.watch.poller.xǁWatchǁhint__mutmut_9", DIFF) == HINT, "renumbered: the same"


def test_a_run_that_matches_the_record_passes() -> None:
    found = {**statuses(RESULTS), **MANY_KILLED}
    assert statuses(RESULTS)["sidecar.watch.native.x__close__mutmut_1"] == "timeout"
    changes = {"sidecar.watch.poller.xǁWatchǁhint__mutmut_1": HINT}
    assert check(found, changes, {HINT: "equivalent"}) == []


def test_a_survivor_the_record_does_not_judge_fails_and_so_does_one_no_longer_alive() -> None:
    found = {**statuses(RESULTS), **MANY_KILLED}
    changes = {"sidecar.watch.poller.xǁWatchǁhint__mutmut_1": HINT}
    gone = ("sidecar.watch.poller.xǁWatchǁhint", "a = 1", "a = 2")
    assert check(found, changes, {gone: "left"}) == [
        "survives, and the record does not judge it: "
        "sidecar.watch.poller.xǁWatchǁhint: `if links and len(self._links) < MAX_LINKS:` -> "
        "`if links or len(self._links) < MAX_LINKS:`",
        "listed in the record, and no longer survives: sidecar.watch.poller.xǁWatchǁhint: `a = 1` -> `a = 2`",
    ]
    assert check(found, changes, {HINT: "?"})[0].startswith("survives, and the record does not judge it")


def test_a_score_under_the_floor_fails_even_when_every_survivor_is_judged() -> None:
    found = statuses(RESULTS)
    changes = {"sidecar.watch.poller.xǁWatchǁhint__mutmut_1": HINT}
    assert check(found, changes, {HINT: "equivalent"}) == ["66.7% of mutants killed, under the floor of 90%"]
    assert check({}, {}, {}) == ["no mutants: run `mutmut run` first"]


def test_a_mutant_the_run_could_not_judge_is_reported_as_such_not_as_a_survivor() -> None:
    found = {**MANY_KILLED, "sidecar.watch.x.y__mutmut_20": "suspicious"}
    assert check(found, {}, {}) == ["not judged by this run (suspicious): sidecar.watch.x.y__mutmut_20"]


def test_writing_the_record_keeps_its_verdicts_and_marks_new_survivors_unjudged() -> None:
    found = {**statuses(RESULTS), "sidecar.watch.native.x__close__mutmut_4": "survived"}
    close = (
        "sidecar.watch.native.x__close",
        "await asyncio.gather(reader, return_exceptions=True)",
        "await asyncio.gather(return_exceptions=True)",
    )
    changes = {"sidecar.watch.poller.xǁWatchǁhint__mutmut_1": HINT, "sidecar.watch.native.x__close__mutmut_4": close}
    text = written(changes, found, {HINT: "equivalent"})
    assert recorded(text) == {HINT: "equivalent", close: "?"}


def test_a_record_line_without_a_verdict_is_refused_with_its_line() -> None:
    with pytest.raises(ValueError, match="line 2: the verdict must be one of"):
        recorded("# a comment\nsidecar.watch.x.y\tmaybe\ta\tb\n")
    with pytest.raises(ValueError, match="line 1: four tab-separated fields"):
        recorded("sidecar.watch.x.y equivalent\n")


def test_a_run_of_some_modules_is_checked_and_written_for_those_only() -> None:
    assert module_of("sidecar.watch.budget.xǁReadBudgetǁslot__mutmut_3") == "sidecar.watch.budget"
    assert module_of("sidecar.protocol.frames.x_notification") == "sidecar.protocol.frames"
    assert in_scope("sidecar.watch.budget.xǁReadBudgetǁslot", ["sidecar.watch"])
    assert not in_scope("sidecar.watch_other.x_f", ["sidecar.watch"]) and in_scope("sidecar.x.x_f", [])
    other = ("sidecar.fair_share.xǁFairShareǁrelease", "a = 1", "a = 2")
    found = {**statuses(RESULTS), **MANY_KILLED}
    changes = {"sidecar.watch.poller.xǁWatchǁhint__mutmut_1": HINT}
    text = written(changes, found, {HINT: "equivalent", other: "left"}, ["sidecar.watch"])
    assert recorded(text) == {HINT: "equivalent", other: "left"}, "the fair share's line kept: it was not run"
    assert recorded(written(changes, found, {other: "left"})) == {HINT: "?"}, "a whole run rewrites every line"


def test_each_modules_score_is_reported_as_the_docs_table_counts_it() -> None:
    found = {**statuses(RESULTS), "sidecar.watch.poller.xǁWatchǁhint__mutmut_3": "no tests"}
    assert scores(found) == [
        "sidecar.watch.native: 0 / 1 / 0 / 0 of 1: 100.0%",
        "sidecar.watch.poller: 1 / 0 / 1 / 1 of 3: 33.3%",
    ]
