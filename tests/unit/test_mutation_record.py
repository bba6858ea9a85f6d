"""The mutation record's check (`python -m tests.mutation_record`), and the record itself, stay sound."""

from __future__ import annotations

import pytest

from tests.mutation_record import RECORD, check, recorded, statuses

RESULTS = """
    sidecar.watch.poller.xǁWatchǁhint__mutmut_1: survived
    sidecar.watch.poller.xǁWatchǁhint__mutmut_2: killed
    sidecar.watch.native.x__close__mutmut_1: timeout
"""


def test_the_committed_record_judges_each_survivor_of_the_engine_once() -> None:
    record = recorded(RECORD.read_text())
    assert record, "the record lists the survivors of the last fresh run"
    assert all(name.startswith(("sidecar.watch.", "sidecar.changes.")) for name in record)
    assert set(record.values()) <= {"equivalent", "left"}


def test_a_run_that_matches_the_record_passes() -> None:
    found = statuses(RESULTS)
    assert found == {
        "sidecar.watch.poller.xǁWatchǁhint__mutmut_1": "survived",
        "sidecar.watch.poller.xǁWatchǁhint__mutmut_2": "killed",
        "sidecar.watch.native.x__close__mutmut_1": "timeout",
    }
    record = {"sidecar.watch.poller.xǁWatchǁhint__mutmut_1": "equivalent"}
    assert check({**found, **{f"sidecar.watch.x.y__mutmut_{n}": "killed" for n in range(20)}}, record) == []


def test_a_survivor_the_record_does_not_judge_fails_and_so_does_one_no_longer_alive() -> None:
    found = {**statuses(RESULTS), **{f"sidecar.watch.x.y__mutmut_{n}": "killed" for n in range(20)}}
    problems = check(found, {"sidecar.watch.poller.xǁWatchǁhint__mutmut_2": "left"})
    assert problems == [
        "survives, and the record does not judge it: sidecar.watch.poller.xǁWatchǁhint__mutmut_1",
        "listed in the record, and no longer survives: sidecar.watch.poller.xǁWatchǁhint__mutmut_2",
    ]


def test_a_score_under_the_floor_fails_even_when_every_survivor_is_judged() -> None:
    found = statuses(RESULTS)
    problems = check(found, {"sidecar.watch.poller.xǁWatchǁhint__mutmut_1": "equivalent"})
    assert problems == ["66.7% of mutants killed, under the floor of 90%"]
    assert check({}, {}) == ["no mutants: run `mutmut run` first"]


def test_a_record_line_without_a_verdict_is_refused_with_its_line() -> None:
    with pytest.raises(ValueError, match="line 2: the verdict must be one of"):
        recorded("# a comment\nsidecar.watch.x.y__mutmut_1 maybe\n")


def test_a_mutant_the_run_could_not_judge_is_reported_as_such_not_as_a_survivor() -> None:
    found = {
        **{f"sidecar.watch.x.y__mutmut_{n}": "killed" for n in range(20)},
        "sidecar.watch.x.y__mutmut_20": "suspicious",
    }
    assert check(found, {}) == ["not judged by this run (suspicious): sidecar.watch.x.y__mutmut_20"]
