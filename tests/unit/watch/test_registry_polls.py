"""A watch's poll as the registry runs it, where real I/O matters: the concurrency gate and what a poll counts,
times and logs, the spans it makes, a crash that must not stop the watch, the publish its next poll waits for,
the poll a watch's end cancels, and tickets taken as a slow poll starts. A real `WatchRegistry` on the hand-moved
clock, reading a scripted upstream; the rules behind each poll (ticket order, backoff, hints, budgets) are the
engine's playbooks (`test_engine_polls`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import cast

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sidecar.changes import WatchKey
from sidecar.identity import PUBLIC
from sidecar.observability.tracing import MAX_LINKS, tracing
from sidecar.protocol.errors import UpstreamBadResponse, UpstreamError, UpstreamHTTPError, UpstreamUnavailable
from sidecar.upstream.base import Upstream
from sidecar.watch import poll_tasks
from sidecar.watch.engine.polls import LogLimiter
from sidecar.watch.looks import Looks
from tests.kit import eventually
from tests.unit.watch.manual_clock import run_polls
from tests.unit.watch.registry_world import (
    ALICE,
    BOB,
    CAROL,
    CONFIG,
    DOC,
    OTHER,
    GatedBus,
    World,
    failures,
    fp,
    make_world,
)
from tests.unit.watch.scripted_upstream import URL, contents

ALICES_DOC = WatchKey("resource", DOC, "alice")
ALICES_OTHER = WatchKey("resource", OTHER, "alice")


async def _two_watches(world: World) -> None:
    """alice watches DOC and OTHER (private to her): both poll at 5 s, DOC first."""
    for uri in (DOC, OTHER):
        world.upstream.resources[uri] = contents(uri, "v1")
        assert await world.registry.acquire("resource", uri, ALICE) is not None


async def test_a_poll_counts_its_outcome_times_its_read_and_its_lag_and_reports_a_wait_for_max_concurrency() -> None:
    world = make_world(CONFIG.model_copy(update={"max_concurrency": 1}))
    await _two_watches(world)
    world.upstream.resources[DOC] = contents(DOC, "v2")
    world.upstream.gate = asyncio.Event()
    asked = world.upstream.asked["resources/read"]
    asked.clear()
    assert world.clock.advance(5.0) == 2
    await asked.wait()  # DOC's poll holds the one slot; OTHER's waits for it
    assert world.clock.advance(0.5) == 0
    world.upstream.gate.set()
    await world.clock.until(lambda: world.registry.polls_in_flight == 0, "both polls ended")
    assert world.gauge("mcp_sidecar_polls_total", kind="resource", outcome="ok") == 2
    assert world.gauge("mcp_sidecar_changes_total", kind="resource") == 1
    assert world.gauge("mcp_sidecar_poll_changes_total", kind="resource") == 1
    assert world.gauge("mcp_sidecar_poll_duration_seconds_sum", kind="resource") == pytest.approx(0.5)
    assert world.gauge("mcp_sidecar_poll_schedule_lag_seconds_sum") == pytest.approx(0.5), "OTHER's, from its wait"
    assert world.gauge("mcp_sidecar_poll_schedule_lag_seconds_count") == 2
    assert world.gauge("mcp_sidecar_queue_wait_seconds_count", limit="poll_concurrency") == 1, "DOC's waited not"
    assert world.gauge("mcp_sidecar_queue_wait_seconds_sum", limit="poll_concurrency") == pytest.approx(0.5)
    assert all(watch.last_poll_at == pytest.approx(time.time(), abs=5) for watch in world.registry.watches())
    # A poll that starts before it was due (a loop may run a timer a hair early) reports no negative lag.
    looks = Looks(cast(Upstream, world.upstream), CONFIG, world.fair_share, world.metrics, world.clock)
    await looks.poll(ALICES_DOC, world.clock.now() + 3.0, lambda key: ALICE)
    assert world.gauge("mcp_sidecar_poll_schedule_lag_seconds_sum") == pytest.approx(0.5)
    assert world.gauge("mcp_sidecar_poll_schedule_lag_seconds_count") == 3
    await world.registry.aclose()


@pytest.mark.parametrize(
    ("failure", "level"),
    [
        (UpstreamUnavailable(URL, "connection refused"), logging.INFO),
        (UpstreamBadResponse(URL, "garbage"), logging.WARNING),
        (UpstreamHTTPError(URL, 401, "Unauthorized"), None),
    ],
    ids=["upstream-down-at-info", "bad-answer-at-warning", "refused-credential-not-logged"],
)
async def test_a_failing_poll_is_counted_and_logs_one_line_per_failure_streak_and_one_per_ten_seconds_for_all(
    failure: UpstreamError, level: int | None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(poll_tasks, "_failures_logged", LogLimiter(10.0))  # a fresh one-line-per-10-s
    world = make_world()
    await _two_watches(world)
    world.upstream.failure = failure
    with caplog.at_level(logging.INFO, logger="sidecar.watch.poll_tasks"):
        await world.step(5.0, looks=2)  # both fail: the second within the ten seconds of the first's line
        await world.step(1.2, looks=2)  # again, a backoff (1 s, jittered) later: the same streaks
    lines = [r for r in caplog.records if r.name == "sidecar.watch.poll_tasks"]
    assert world.gauge("mcp_sidecar_polls_total", kind="resource", outcome="error") == 4
    assert world.gauge("mcp_sidecar_polls_total", kind="resource", outcome="ok") == 0
    assert [watch.consecutive_errors for watch in world.registry.watches()] == [2, 2]
    if level is None:  # the registry's auth listener is told (the context's streams end), not the log
        assert lines == []
        assert sorted(world.refusals, key=str) == [(ALICES_DOC, "alice")] * 2 + [(ALICES_OTHER, "alice")] * 2
    else:
        assert [(r.getMessage(), r.levelno) for r in lines] == [("poll failed; backing off", level)]
        fields = {name: getattr(lines[0], name, None) for name in ("watch", "kind", "reason")}
        assert fields == {"watch": ALICES_DOC.short_hash, "kind": "resource", "reason": failure.reason}
        assert world.refusals == []
    await world.registry.aclose()


async def test_a_poll_span_links_the_writes_that_hinted_it_and_names_the_uri_only_of_a_public_watch(
    world: World, spans: InMemorySpanExporter
) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1", cacheScope="public")
    world.upstream.private[(OTHER, "carol")] = contents(OTHER, "carol's")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    assert await world.registry.acquire("resource", OTHER, CAROL) is not None
    writes = []
    for identity in [ALICE] * 5 + [BOB] * 5:  # one round of hints at once, the rest at the debounce's end
        with tracing().request("tools/call", {}, None) as span:
            world.registry.hearing.after_forward(
                "tools/call", {}, identity, {"result": {}}, world.registry.hearing.ticket()
            )
            writes.append(span.get_span_context())
    world.upstream.resources[DOC] = contents(DOC, "v2", cacheScope="public")
    world.upstream.private[(OTHER, "carol")] = contents(OTHER, "carol's v2")
    await world.step(0.25, looks=1)  # the public watch's hinted poll (min_interval_ms after its first look)
    await world.step(4.75, looks=1)  # carol's, at its interval: nobody's write concerns it
    polls = [span for span in spans.get_finished_spans() if span.name == "poll"]
    public, private = WatchKey("resource", DOC, PUBLIC), WatchKey("resource", OTHER, "carol")
    assert [dict(span.attributes or {}) for span in polls] == [
        {"mcp_sidecar.watch": public.short_hash, "mcp_sidecar.kind": "resource", "mcp_sidecar.uri": DOC},
        {"mcp_sidecar.watch": private.short_hash, "mcp_sidecar.kind": "resource"},
    ]
    assert [link.context for link in polls[0].links] == writes[:MAX_LINKS]
    assert list(polls[1].links) == []
    changes = [span for span in spans.get_finished_spans() if span.name == "change"]
    assert [dict(span.attributes or {}) for span in changes] == [
        {"mcp_sidecar.watch": key.short_hash, "mcp_sidecar.kind": "resource", "mcp_sidecar.generation": 1}
        for key in (public, private)
    ]
    assert all(
        change.parent is not None and change.parent.span_id == poll.context.span_id
        for change, poll in zip(changes, polls, strict=True)
    )


async def test_a_poll_that_crashes_is_logged_and_backs_off_like_a_failure_and_its_watch_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = make_world()
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    polled_at: list[float] = []

    def crash() -> None:
        polled_at.append(world.clock.now())
        raise RuntimeError("a bug in the read")

    world.upstream.before_answer = crash
    with caplog.at_level(logging.ERROR):
        await run_polls(world.clock, 8.5, lambda: world.registry.polls_in_flight)
    assert polled_at == [5.0, pytest.approx(6.0, abs=0.11), pytest.approx(8.0, abs=0.31)], "backoffs of 1 s, 2 s"
    [watch] = world.registry.watches()
    assert watch.consecutive_errors == 3
    crashes = [record for record in caplog.records if record.getMessage() == "poll crashed"]
    assert len(crashes) == 3
    assert all(record.levelno == logging.ERROR and record.exc_info is not None for record in crashes)
    assert {(getattr(r, "watch", None), getattr(r, "kind", None)) for r in crashes} == {
        (ALICES_DOC.short_hash, "resource")
    }
    world.upstream.before_answer = None
    world.upstream.resources[DOC] = contents(DOC, "v2")
    # The next backoff (4 s, jittered up to a tenth either way, from a poll as late as 8.31) ends by 13.0; the poll
    # after it comes an interval (5 s) later.
    await run_polls(world.clock, 4.5, lambda: world.registry.polls_in_flight)
    assert world.changes() == [(ALICES_DOC, fp(DOC, "v2"))], "the watch still polls, and tells what it sees"
    await world.registry.aclose()


async def test_a_change_is_logged_with_both_fingerprints_short_and_published_before_the_next_poll_is_armed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus = GatedBus()
    world = make_world(bus=bus)
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    world.upstream.resources[DOC] = contents(DOC, "v2")
    bus.gate = asyncio.Event()
    with caplog.at_level(logging.INFO, logger="sidecar.watch.poll_tasks"):
        assert world.clock.advance(5.0) == 1
        # Seen (counted as it is seen), and held by the bus: nothing else to wait on but the count.
        await eventually(lambda: world.gauge("mcp_sidecar_changes_total", kind="resource") == 1, what="the change")
    assert world.registry.polls_in_flight == 1 and world.changes() == [], "its publish is held"
    assert world.clock.pending() == 0, "no next poll before the change is out"
    bus.gate.set()
    await world.clock.until(lambda: world.clock.pending() == 1, "the next poll armed")
    assert world.changes() == [(ALICES_DOC, fp(DOC, "v2"))]
    assert world.clock.due() == [10.0]
    [record] = [r for r in caplog.records if r.getMessage() == "change detected"]
    fields = {name: getattr(record, name, None) for name in ("watch", "kind", "generation", "old", "new")}
    assert fields == {
        "watch": ALICES_DOC.short_hash,
        "kind": "resource",
        "generation": 1,
        "old": fp(DOC, "v1")[:8],
        "new": fp(DOC, "v2")[:8],
    }
    await world.registry.aclose()


async def test_a_watch_that_ends_cancels_its_poll_in_flight_and_nothing_is_armed_after_it(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    world.upstream.gate = asyncio.Event()
    asked = world.upstream.asked["resources/read"]
    asked.clear()
    assert world.clock.advance(5.0) == 1
    await asked.wait()  # the poll is in flight, held by the upstream
    handle.release()
    world.upstream.resources[DOC] = contents(DOC, "v2")
    assert world.clock.advance(8.0) == 1, "the linger ends the watch"
    armed = world.clock.armed
    assert world.watches() == {} and world.registry.polls_in_flight == 0
    world.upstream.gate.set()
    await world.registry.aclose()  # awaits the cancelled poll
    assert world.clock.armed == armed, "the cancelled poll armed no next one"
    assert world.gauge("mcp_sidecar_polls_total", kind="resource", outcome="ok") == 0, "its answer never came back"
    assert world.changes() == []
    assert world.upstream.reads(DOC) == ["alice", "alice"]
    assert failures(caplog) == [], "nor is the cancelled poll a crash"


@pytest.mark.invariant(7)
async def test_a_slow_poll_that_started_before_a_fresher_look_does_not_overwrite_it(world: World) -> None:
    # The poll's ticket is taken as it starts: a look that starts after it and is applied first wins, even though
    # the poll's answer arrives last.
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    world.upstream.gate = asyncio.Event()
    asked = world.upstream.asked["resources/read"]
    asked.clear()
    assert world.clock.advance(5.0) == 1
    await asked.wait()
    fresh = {"result": contents(DOC, "fresh")}
    world.registry.hearing.after_forward("resources/read", {"uri": DOC}, ALICE, fresh, world.registry.hearing.ticket())
    world.upstream.resources[DOC] = contents(DOC, "stale")  # what the slow poll's answer shows
    world.upstream.gate.set()
    await world.clock.until(lambda: world.registry.polls_in_flight == 0, "the slow poll ended")
    await world.clock.until(lambda: world.changes() != [], "the fresh look told")
    assert world.changes() == [(ALICES_DOC, fp(DOC, "fresh"))], "the stale answer is no change either"
    [watch] = world.registry.watches()
    assert watch.fingerprint == fp(DOC, "fresh")


async def test_the_hold_before_publishing_seam_logs_the_line_the_replica_tests_wait_for_then_holds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # tests/replicas/test_replica_coherence.py kills an owner once it logs this line (the seam is on only
    # under MCP_SIDECAR_TEST_HOLD_BEFORE_PUBLISH=1).
    with caplog.at_level(logging.WARNING, logger="sidecar.watch.poll_tasks"):
        hold = asyncio.create_task(poll_tasks._hold())
        await asyncio.sleep(0)
    assert not hold.done(), "it holds the change for ever"
    hold.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await hold
    lines = [r.getMessage() for r in caplog.records if r.name == "sidecar.watch.poll_tasks"]
    assert lines == ["holding a change before publishing it (MCP_SIDECAR_TEST_HOLD_BEFORE_PUBLISH)"]
