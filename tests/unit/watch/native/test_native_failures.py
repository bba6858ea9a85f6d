"""The upstream's own notifications as hints (`sidecar.watch.native`) when the stream breaks: its keys uncovered,
reopened with a backoff that doubles to half a minute (jittered, logged once a streak), crashes treated like
failures, and an upstream that serves no stream asked once and then only polled. The rules as playbooks
(`native_book.py`: a 2025-11-25 upstream unless a test says otherwise); the era probed afresh after an outage and a
crash caught by a stream's task, on the scripted upstream that can push with a clock moved by hand
(`native_harness.py`).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from itertools import pairwise

import pytest

from sidecar.protocol.errors import UpstreamError, UpstreamHTTPError, UpstreamRpcError, UpstreamUnavailable
from sidecar.watch import native_rules
from sidecar.watch.native_events import (
    Began,
    Debounce,
    Debounced,
    Dropped,
    Finish,
    Held,
    Listen,
    Log,
    OpenSession,
    Probe,
    Probed,
    Retry,
    RetryDue,
    Start,
    Stop,
    Stopped,
    StreamCrashed,
    StreamEnded,
    StreamFailed,
    StreamsOpen,
    Wake,
    Woken,
)
from sidecar.watch.native_rules import ENDED, FAILED, REFILTER_DEBOUNCE_S, UNSUPPORTED
from tests.unit.watch.native.native_book import (
    Book,
    book,
    cover,
    listened,
    listening,
    rules,
    subscribed,
)
from tests.unit.watch.native.native_harness import ALICE, BOB, DOC, EVERYTHING, OTHER, Bench, FixedJitter
from tests.unit.watch.scripted_upstream import URL

RESET = UpstreamUnavailable(URL, "connection reset")
REFUSED = UpstreamUnavailable(URL, "connection refused")


def _broken(play: Book, *, logged: bool = True, wait: float = 0.5) -> None:
    """Alice's covered stream fails: DOC uncovered (polled at its usual pace until the stream is back), the gauge
    down, logged if the streak starts, and tried again after `wait`."""
    play.step(
        StreamFailed(1, RESET),
        *([Log(FAILED, "connection reset")] if logged else []),
        StreamsOpen(-1),
        *cover("resource", DOC, "alice", own=False, public=False),
        Retry(1, wait),
    )


def test_a_broken_stream_uncovers_its_keys_and_reopens_after_half_a_second() -> None:
    play = book()
    subscribed(play, 1, ALICE, DOC)
    _broken(play)
    subscribed(play.at(0.5), 1, ALICE, DOC, again=True)  # covered again: polled once for what changed meanwhile


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


def test_a_stream_the_upstream_ends_is_opened_again() -> None:
    play = book()
    subscribed(play, 1, ALICE, DOC)
    play.step(
        StreamEnded(1),
        Log(FAILED, ENDED),
        StreamsOpen(-1),
        *cover("resource", DOC, "alice", own=False, public=False),
        Retry(1, 0.5),
    )
    subscribed(play.at(0.5), 1, ALICE, DOC, again=True)


def _refused(play: Book, error: Exception, *expected: Log | Retry | Finish, again: bool = True) -> None:
    """Alice's stream tries again (`again`) or for the first time, and opening it fails with `error`."""
    if again:
        play.step(RetryDue(1), Probe(1))
    else:
        play.step(Held(ALICE, "resource", DOC, EVERYTHING), Start(1, ALICE))
        play.step(Began(1), Probe(1))
    play.step(Probed(1, False, EVERYTHING), OpenSession(1))
    failed = StreamFailed(1, error) if isinstance(error, UpstreamError) else StreamCrashed(1)
    play.step(failed, *expected)


def test_a_stream_whose_task_ended_while_its_context_holds_keys_starts_afresh_on_the_next_hold() -> None:
    # Only a bug outside the stream's steps ends its task while keys are held: the next hold starts it again, once,
    # and its old failures do not count against the new task (it logs its first failure, and waits the first wait).
    play = book()
    _refused(play, REFUSED, Log(FAILED, "connection refused"), Retry(1, 0.5), again=False)
    play.step(Stopped(1))
    play.step(Held(ALICE, "tools_list", None, EVERYTHING), Start(1, ALICE))
    play.step(Held(ALICE, "prompts_list", None, EVERYTHING), Wake(1))  # running again: woken, not started twice
    assert rules(play).streams() == 1
    play.step(Began(1), Probe(1))
    play.step(Probed(1, False, EVERYTHING), OpenSession(1))
    play.step(StreamFailed(1, REFUSED), Log(FAILED, "connection refused"), Retry(1, 0.5))


def test_repeated_failures_back_off_doubling_to_half_a_minute_and_log_once_a_streak() -> None:
    play = book()
    _refused(play, REFUSED, Log(FAILED, "connection refused"), Retry(1, 0.5), again=False)
    waits = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0]  # after each of ten refusals in a row
    for wait, next_wait in pairwise(waits):
        _refused(play.at(play.now + wait), REFUSED, Retry(1, next_wait))
    subscribed(play.at(play.now + 30.0), 1, ALICE, DOC, again=True)
    play.step(  # at once: an upstream that accepts the stream, then drops it, goes on with its streak's backoff
        StreamFailed(1, REFUSED),
        StreamsOpen(-1),
        *cover("resource", DOC, "alice", own=False, public=False),
        Retry(1, 30.0),
    )
    subscribed(play.at(play.now + 30.0), 1, ALICE, DOC, again=True)
    play.at(play.now + 30.0).step(  # after half a minute up: a new streak, logged again
        StreamFailed(1, REFUSED),
        Log(FAILED, "connection refused"),
        StreamsOpen(-1),
        *cover("resource", DOC, "alice", own=False, public=False),
        Retry(1, 0.5),
    )
    subscribed(play.at(play.now + 0.5), 1, ALICE, DOC, again=True)


@pytest.mark.parametrize(("jitter", "first_wait"), [(0.0, 0.25), (0.999, 0.7495)])
def test_the_backoff_is_jittered_between_half_and_one_and_a_half_times(
    monkeypatch: pytest.MonkeyPatch, jitter: float, first_wait: float
) -> None:
    monkeypatch.setattr(native_rules, "RETRY", replace(native_rules.RETRY, rand=FixedJitter(jitter).random))
    wait = pytest.approx(first_wait)
    _refused(book(), REFUSED, Log(FAILED, "connection refused"), Retry(1, wait), again=False)  # type: ignore[arg-type]


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


def test_crashes_back_off_like_failures_and_a_stream_that_stayed_up_starts_a_new_streak() -> None:
    """Logged where it was caught, with its traceback, each time (the test above): the rules log nothing more."""
    play = book()
    _refused(play, RuntimeError("a bug"), Retry(1, 0.5), again=False)
    _refused(play.at(0.5), RuntimeError("a bug"), Retry(1, 1.0))  # twice as long after the second
    subscribed(play.at(1.5), 1, ALICE, DOC, again=True)
    play.at(31.5).step(  # back after half a second: the stream had stayed up
        StreamCrashed(1),
        StreamsOpen(-1),
        *cover("resource", DOC, "alice", own=False, public=False),
        Retry(1, 0.5),
    )
    subscribed(play.at(32.0), 1, ALICE, DOC, again=True)


@pytest.mark.parametrize(
    "refusal",
    [
        UpstreamHTTPError(URL, 405, "Method Not Allowed"),
        UpstreamHTTPError(URL, 404, "Not Found"),
        UpstreamRpcError(URL, {"code": -32601, "message": "Method not found"}),
    ],
    ids=["no-get-stream-405", "no-listen-404", "no-listen-method"],
)
def test_an_upstream_that_serves_no_stream_is_asked_once_and_then_only_polled(refusal: UpstreamError) -> None:
    play = book()
    _refused(play, refusal, Log(FAILED, refusal.reason), Log(UNSUPPORTED, refusal.reason), Finish(1), again=False)
    assert rules(play).unsupported
    play.step(Stopped(1))  # the refused stream's task ends, and lets go of its credential
    assert rules(play).streams() == 0 and rules(play).contexts() == [], "no stream keeps alice's credential"
    play.step(Held(BOB, "resource", OTHER, EVERYTHING))  # never asked again: no stream is started
    play.step(Held(ALICE, "tools_list", None, EVERYTHING))
    assert not rules(play).covers("resource", DOC, "alice")


@pytest.mark.parametrize(
    "refusal",
    [
        UpstreamHTTPError(URL, 500, "Internal Server Error"),
        UpstreamHTTPError(URL, 403, "Forbidden"),
        UpstreamRpcError(URL, {"code": -32603, "message": "Internal error"}),
    ],
    ids=["500", "403", "internal-error"],
)
def test_other_refusals_are_tried_again(refusal: UpstreamError) -> None:
    play = book()
    _refused(play, refusal, Log(FAILED, refusal.reason), Retry(1, 0.5), again=False)
    assert not rules(play).unsupported
    subscribed(play.at(0.5), 1, ALICE, DOC, again=True)


# -- a stream let go of, or with nothing left to ask for ----------------------------------------------------------


def test_a_stream_with_nothing_left_to_ask_for_closes_and_tries_again_with_its_backoff_from_the_start() -> None:
    play = book()
    listening(play, 1, ALICE, "resource", DOC)
    play.step(StreamFailed(1, RESET), Log(FAILED, RESET.reason), Retry(1, 0.5))  # a streak of failures begins
    play.step(RetryDue(1), Probe(1))
    # Back, the upstream declares nothing alice holds: no listen to ask for, so none is opened; tried again.
    play.step(Probed(1, True, {}), Retry(1, 0.5))
    play.step(RetryDue(1), Probe(1))
    wanted = {"resourceSubscriptions": [DOC]}
    play.step(Probed(1, True, EVERYTHING), Listen(1, wanted))
    # A failure now starts a new streak: logged again, and backed off from its first step.
    play.step(StreamFailed(1, RESET), Log(FAILED, RESET.reason), Retry(1, 0.5))


def test_a_stream_let_go_of_before_it_begins_or_retries_asks_the_upstream_nothing() -> None:
    play = book()
    play.step(Held(ALICE, "resource", DOC, EVERYTHING), Start(1, ALICE))
    play.step(Dropped("alice", "resource", DOC), Stop(1))
    play.step(Began(1), Finish(1))
    listening(play, 2, BOB, "resource", DOC)
    play.step(StreamFailed(2, RESET), Log(FAILED, RESET.reason), Retry(2, 0.5))
    play.step(Dropped("bob", "resource", DOC), Stop(2))
    play.step(RetryDue(2), Finish(2))


def test_a_stream_let_go_of_while_it_waits_to_ask_again_closes_and_uncovers_what_it_covered() -> None:
    play = book()
    listened(play)
    play.step(Held(ALICE, "tools_list", None, EVERYTHING), Wake(1))
    play.step(Woken(1), Debounce(1, REFILTER_DEBOUNCE_S))
    play.step(Dropped("alice", "resource", DOC), Wake(1))
    play.step(Dropped("alice", "tools_list", None), Stop(1))
    play.step(
        Debounced(1, EVERYTHING),
        StreamsOpen(-1),
        *cover("resource", DOC, "alice", own=False, public=False),
        Finish(1),
    )


def test_a_stream_let_go_of_that_then_crashes_finishes_without_trying_again() -> None:
    play = book()
    listening(play, 1, ALICE, "resource", DOC)
    play.step(Dropped("alice", "resource", DOC), Stop(1))
    play.step(StreamCrashed(1), Finish(1))
