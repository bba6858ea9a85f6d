"""The upstream's own notifications as hints (`sidecar.watch.native`) when the stream breaks: its keys uncovered,
reopened with a backoff that doubles to half a minute (jittered, logged once a streak), crashes treated like
failures, and an upstream that serves no stream asked once and then only polled. A scripted upstream that can
push, a clock moved by hand, and waits on what the fakes report (`tests/unit/watch/native/native_harness.py`).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from sidecar.protocol.errors import UpstreamError, UpstreamHTTPError, UpstreamRpcError, UpstreamUnavailable
from sidecar.watch import native_rules
from tests.unit.watch.native.native_harness import (
    ALICE,
    BOB,
    DOC,
    OTHER,
    Bench,
    FixedJitter,
    ended,
    stream_tasks,
)
from tests.unit.watch.scripted_upstream import URL


async def test_a_broken_stream_uncovers_its_keys_and_reopens_after_half_a_second(
    legacy: Bench, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.watch.native")
    doc = legacy.watch("resource", DOC, ALICE)
    await legacy.until(lambda: doc.native)
    legacy.upstream.opened[0].fail(UpstreamUnavailable(URL, "connection reset"))
    await legacy.timer_at(0.5)
    assert not doc.native, "uncovered: polled at its usual pace until the stream is back"
    assert len(legacy.covered()) == 0
    assert legacy.gauge("mcp_sidecar_native_streams") == 0
    assert legacy.clock.advance(0.49) == 0
    assert len(legacy.upstream.opened) == 1
    doc.hints = 0
    legacy.clock.advance(0.01)
    await legacy.until(lambda: len(legacy.upstream.opened) == 2 and doc.native)
    assert legacy.gauge("mcp_sidecar_native_streams") == 1
    assert doc.hints == 1, "covered again: polled once for what changed while it was not"
    assert [record.getMessage() for record in caplog.records] == ["upstream notification stream failed"]


async def test_after_an_outage_the_era_is_learned_again_before_the_stream_reopens_and_its_keys_are_covered(
    legacy: Bench,
) -> None:
    await _reopens_in_the_era_learned_again(legacy)


async def test_after_an_outage_a_2026_upstream_is_listened_to_again_not_taken_for_a_2025_one(modern: Bench) -> None:
    await _reopens_in_the_era_learned_again(modern)


async def _reopens_in_the_era_learned_again(pushing: Bench) -> None:
    doc = pushing.watch("resource", DOC, ALICE)
    await pushing.until(lambda: doc.native)
    # The outage: the era is forgotten, to be probed afresh once the upstream answers (which it does by the retry).
    pushing.upstream.learns, pushing.upstream.info = pushing.upstream.info, None
    pushing.upstream.opened[0].fail(UpstreamUnavailable(URL, "connection reset"))
    await pushing.timer_at(0.5)
    pushing.clock.advance(0.5)
    await pushing.until(lambda: len(pushing.upstream.opened) == 2 and doc.native)
    assert pushing.upstream.opened[1].wanted == pushing.upstream.opened[0].wanted, "the same era's stream again"


async def test_a_stream_the_upstream_ends_is_opened_again(legacy: Bench, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.watch.native")
    doc = legacy.watch("resource", DOC, ALICE)
    await legacy.until(lambda: doc.native)
    legacy.upstream.opened[0].end()
    await legacy.timer_at(0.5)
    assert [(r.getMessage(), getattr(r, "reason", None)) for r in caplog.records] == [
        ("upstream notification stream failed", "the notification stream ended")
    ]
    assert not doc.native and legacy.upstream.open == []
    legacy.clock.advance(0.5)
    await legacy.until(lambda: len(legacy.upstream.open) == 1 and doc.native)


async def _next_attempt(bench: Bench) -> float:
    """Fire the retry the stream waits on; how long it waited (on the hand-moved clock)."""
    attempts = bench.upstream.attempts
    await bench.until(lambda: len(bench.clock.due()) == 1)
    before = bench.clock.now()
    bench.clock.fire_next()
    await bench.until(lambda: bench.upstream.attempts == attempts + 1)
    return bench.clock.now() - before


async def test_repeated_failures_back_off_doubling_to_half_a_minute_and_log_once_a_streak(
    legacy: Bench, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.watch.native")
    refusal = UpstreamUnavailable(URL, "connection refused")
    legacy.upstream.refusals = [refusal] * 10
    legacy.watch("resource", DOC, ALICE)
    await legacy.until(lambda: legacy.upstream.attempts == 1)
    waits = [await _next_attempt(legacy) for _ in range(9)]
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert [record.getMessage() for record in caplog.records] == ["upstream notification stream failed"]
    await legacy.timer_at(legacy.clock.now() + 30.0)
    legacy.clock.advance(30.0)
    await legacy.until(lambda: len(legacy.upstream.open) == 1)
    legacy.upstream.open[0].fail(refusal)  # at once: an upstream that accepts the stream, then drops it
    await legacy.timer_at(legacy.clock.now() + 30.0)
    assert legacy.clock.advance(29.99) == 0
    assert legacy.upstream.open == [], "a stream up a moment goes on with its streak's backoff"
    legacy.clock.advance(0.01)
    await legacy.until(lambda: len(legacy.upstream.open) == 1)
    legacy.clock.advance(30.0)
    legacy.upstream.open[0].fail(refusal)  # after half a minute up
    await legacy.timer_at(legacy.clock.now() + 0.5)
    legacy.clock.advance(0.5)
    await legacy.until(lambda: len(legacy.upstream.open) == 1)  # a stream that stayed up starts a new streak
    assert [record.getMessage() for record in caplog.records] == ["upstream notification stream failed"] * 2


@pytest.mark.parametrize(("jitter", "first_wait"), [(0.0, 0.25), (0.999, 0.7495)])
async def test_the_backoff_is_jittered_between_half_and_one_and_a_half_times(
    legacy: Bench, monkeypatch: pytest.MonkeyPatch, jitter: float, first_wait: float
) -> None:
    monkeypatch.setattr(native_rules, "RETRY", replace(native_rules.RETRY, rand=FixedJitter(jitter).random))
    legacy.upstream.refusals = [UpstreamUnavailable(URL, "connection refused")]
    legacy.watch("resource", DOC, ALICE)
    await legacy.until(lambda: len(legacy.clock.due()) == 1)
    assert legacy.upstream.opened == []
    legacy.clock.fire_next()
    await legacy.until(lambda: len(legacy.upstream.opened) == 1)
    assert legacy.clock.now() == pytest.approx(first_wait)


async def test_a_crash_in_the_stream_is_logged_and_polling_goes_on(
    legacy: Bench, caplog: pytest.LogCaptureFixture
) -> None:
    doc = legacy.watch("resource", DOC, ALICE)
    await legacy.until(lambda: doc.native)
    legacy.upstream.opened[0].fail(RuntimeError("a bug"))
    await legacy.timer_at(0.5)
    records = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert [record.getMessage() for record in records] == ["upstream notification stream crashed"]
    assert records[0].exc_info is not None
    assert not doc.native
    legacy.clock.advance(0.5)
    await legacy.until(lambda: doc.native)  # tried again like any failure
    caplog.clear()


async def test_crashes_back_off_like_failures_and_a_stream_that_stayed_up_starts_a_new_streak(
    legacy: Bench, caplog: pytest.LogCaptureFixture
) -> None:
    legacy.upstream.refusals = [RuntimeError("a bug"), RuntimeError("a bug")]
    doc = legacy.watch("resource", DOC, ALICE)
    await legacy.timer_at(0.5)
    legacy.clock.advance(0.5)
    await legacy.timer_at(1.5)
    assert legacy.upstream.opened == [], "the second crash"
    assert legacy.clock.advance(0.99) == 0, "waits twice as long after the second"
    legacy.clock.advance(0.01)
    await legacy.until(lambda: doc.native)
    legacy.clock.advance(30.0)
    legacy.upstream.opened[0].fail(RuntimeError("a bug"))
    await legacy.timer_at(legacy.clock.now() + 0.5)  # back after half a second: the stream had stayed up
    legacy.clock.advance(0.5)
    await legacy.until(lambda: doc.native)
    assert [r.getMessage() for r in caplog.records] == ["upstream notification stream crashed"] * 3
    caplog.clear()


@pytest.mark.parametrize(
    "refusal",
    [
        UpstreamHTTPError(URL, 405, "Method Not Allowed"),
        UpstreamHTTPError(URL, 404, "Not Found"),
        UpstreamRpcError(URL, {"code": -32601, "message": "Method not found"}),
    ],
    ids=["no-get-stream-405", "no-listen-404", "no-listen-method"],
)
async def test_an_upstream_that_serves_no_stream_is_asked_once_and_then_only_polled(
    legacy: Bench, refusal: UpstreamError, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.watch.native")
    legacy.upstream.refusals = [refusal]
    doc = legacy.watch("resource", DOC, ALICE)
    await legacy.until(lambda: legacy.native.unsupported)
    await ended(stream_tasks())  # the refused stream's task ends
    assert not doc.native
    assert [(r.getMessage(), getattr(r, "reason", None)) for r in caplog.records][-1] == (
        "the upstream serves no notification stream; polling only",
        refusal.reason,
    )
    legacy.watch("resource", OTHER, BOB)
    legacy.watch("tools_list", None, ALICE)
    assert stream_tasks() == set(), "never asked again: no stream is started"
    assert legacy.clock.due() == [] and legacy.upstream.attempts == 1
    assert legacy.covered() == set()


@pytest.mark.parametrize(
    "refusal",
    [
        UpstreamHTTPError(URL, 500, "Internal Server Error"),
        UpstreamHTTPError(URL, 403, "Forbidden"),
        UpstreamRpcError(URL, {"code": -32603, "message": "Internal error"}),
    ],
    ids=["500", "403", "internal-error"],
)
async def test_other_refusals_are_tried_again(legacy: Bench, refusal: UpstreamError) -> None:
    legacy.upstream.refusals = [refusal]
    doc = legacy.watch("resource", DOC, ALICE)
    await legacy.timer_at(0.5)
    assert not legacy.native.unsupported
    legacy.clock.advance(0.5)
    await legacy.until(lambda: doc.native)
