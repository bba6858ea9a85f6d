"""What others see of a watch (`sidecar.watch.engine.views`): the status page's summary and its coordinator's view, both
read from the engine's record as it is when they look."""

from __future__ import annotations

from sidecar.changes import WatchKey
from sidecar.identity import PUBLIC
from sidecar.watch.engine import Record
from sidecar.watch.engine.views import CoordinatorView, WatchSummary, busiest

KEY = WatchKey("resource", "file:///doc", PUBLIC)


def _record() -> Record:
    record = Record(KEY, holders=3, fingerprint="fp-2", generation=2, native=True, interval_s=4.5)
    record.last_poll_at, record.last_change_at = 90.0, 70.0
    return record


def test_a_summary_shows_a_watch_as_the_record_has_it_with_its_times_on_the_wall_clock() -> None:
    # The engine's times are on its monotonic clock: 100 there is 1,000,100 on the wall clock.
    shown = WatchSummary.of(_record(), now=100.0, wall=1_000_100.0)
    assert shown == WatchSummary(KEY, "fp-2", 2, True, 4.5, 1_000_090.0, 1_000_070.0, 0, 3)
    never = WatchSummary.of(Record(KEY), now=100.0, wall=1_000_100.0)
    assert (never.last_poll_at, never.last_change_at) == (None, None), "not polled nor changed yet"


def test_a_coordinator_reads_the_records_fingerprint_as_it_is_now_and_hints_through_the_engine() -> None:
    records: dict[WatchKey, Record] = {KEY: _record()}
    hinted: list[WatchKey] = []
    view = CoordinatorView(KEY, records.get, hinted.append)
    assert view.key == KEY and view.fingerprint == "fp-2"
    records[KEY].fingerprint = "fp-3"
    assert view.fingerprint == "fp-3", "read when asked, never copied"
    view.hint()
    assert hinted == [KEY]
    del records[KEY]
    assert view.fingerprint == "", "its watch ended: nothing told"


def test_the_busiest_watches_come_first_ties_in_the_order_given_and_no_more_than_asked() -> None:
    records = [Record(WatchKey("resource", f"file:///{n}", PUBLIC), holders=holders) for n, holders in
               enumerate((1, 5, 0, 5, 2, 1))]  # fmt: skip
    assert [record.key.uri for record in busiest(records, 4)] == ["file:///1", "file:///3", "file:///4", "file:///0"]
    assert busiest(records, 0) == [] and len(busiest(records, 100)) == 6
