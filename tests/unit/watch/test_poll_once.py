"""One poll, as its driver runs it: what it counts and times, what it logs, the span it makes, and the test seam
that holds a change before it is published. When it polls is `test_schedules`'s; the ticket rule `test_poller`'s."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sidecar.changes import WatchKey
from sidecar.config import PollingConfig
from sidecar.observability.metrics import Metrics
from sidecar.observability.tracing import MAX_LINKS
from sidecar.protocol.errors import UpstreamBadResponse, UpstreamError, UpstreamHTTPError, UpstreamUnavailable
from sidecar.watch import poller
from sidecar.watch.clock import Timer
from sidecar.watch.engine.polls import LogLimiter
from sidecar.watch.observation import Observation
from sidecar.watch.poller import Watch
from tests.unit.watch.watches import make_watch

CONFIG = PollingConfig(default_interval_ms=5000, min_interval_ms=250, max_interval_ms=60000, jitter=0.1)
_watch = functools.partial(make_watch, config=CONFIG)


class _Timer:
    def __init__(self, when: float) -> None:
        self._when = when

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        return None


class _Clock:
    """A clock that reads what the test set; its timers never fire (the polls here are run by hand)."""

    def __init__(self) -> None:
        self.time = 100.0

    def now(self) -> float:
        return self.time

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        return _Timer(when)


def _sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_a_poll_counts_its_outcome_and_times_its_read_and_how_late_it_started() -> None:
    clock, metrics = _Clock(), Metrics()
    seen: list[Watch] = []

    async def read(watch: Watch) -> Observation | None:
        seen.append(watch)
        clock.time += 0.5
        return Observation("fp-1", None, True)

    watch = _watch(read, clock=clock, metrics=metrics)
    await watch.poll_once(due=clock.time - 2.0)
    assert seen == [watch]
    assert _sample(metrics, "mcp_sidecar_polls_total", kind="resource", outcome="ok") == 1
    assert _sample(metrics, "mcp_sidecar_changes_total", kind="resource") == 1
    assert _sample(metrics, "mcp_sidecar_poll_duration_seconds_sum", kind="resource") == pytest.approx(0.5)
    assert _sample(metrics, "mcp_sidecar_poll_schedule_lag_seconds_sum") == pytest.approx(2.0)
    assert watch.last_poll_at is not None and watch.last_poll_at == pytest.approx(time.time(), abs=5)
    await watch.poll_once(due=clock.time + 3.0)  # early (a hint): no negative lag
    assert _sample(metrics, "mcp_sidecar_poll_schedule_lag_seconds_sum") == pytest.approx(2.0)
    assert _sample(metrics, "mcp_sidecar_poll_schedule_lag_seconds_count") == 2


async def test_a_failed_poll_is_counted_as_an_error() -> None:
    metrics = Metrics()

    async def read(_: Watch) -> Observation | None:
        raise UpstreamUnavailable("test", "connection refused")

    watch = _watch(read, metrics=metrics)
    await watch.poll_once(due=0.0)
    assert watch.consecutive_errors == 1
    assert _sample(metrics, "mcp_sidecar_polls_total", kind="resource", outcome="error") == 1
    assert _sample(metrics, "mcp_sidecar_polls_total", kind="resource", outcome="ok") == 0


async def test_a_poll_that_waits_for_max_concurrency_reports_the_wait_and_one_that_does_not_reports_none() -> None:
    clock, metrics, gate = _Clock(), Metrics(), asyncio.Semaphore(1)

    async def read(_: Watch) -> Observation | None:
        return Observation("fp-0", None, True)

    watch = _watch(read, clock=clock, metrics=metrics, gate=gate)
    labels = {"limit": "poll_concurrency"}
    await watch.poll_once(due=clock.time)
    assert metrics.registry.get_sample_value("mcp_sidecar_queue_wait_seconds_count", labels) == 0
    await gate.acquire()
    poll = asyncio.create_task(watch.poll_once(due=clock.time))
    await asyncio.sleep(0)  # the poll is queued on the gate
    clock.time += 1.5
    gate.release()
    await poll
    assert metrics.registry.get_sample_value("mcp_sidecar_queue_wait_seconds_count", labels) == 1
    assert metrics.registry.get_sample_value("mcp_sidecar_queue_wait_seconds_sum", labels) == pytest.approx(1.5)


async def test_a_refused_credential_is_reported_to_the_registry_and_not_logged_as_an_outage(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(poller, "_error_log_limiter", LogLimiter(10.0))  # a fresh one-line-per-10-s
    refused = UpstreamHTTPError("test", 401, "Unauthorized")
    reported: list[tuple[Watch, UpstreamHTTPError]] = []

    async def read(_: Watch) -> Observation | None:
        raise refused

    watch = _watch(read, on_auth_failure=lambda w, exc: reported.append((w, exc)))
    with caplog.at_level(logging.INFO, logger="sidecar.watch.poller"):
        await watch.poll_once(due=0.0)
    assert reported == [(watch, refused)]
    assert watch.consecutive_errors == 1
    assert [r for r in caplog.records if r.name == "sidecar.watch.poller"] == []


@pytest.mark.parametrize(
    ("failure", "level"),
    [
        (UpstreamUnavailable("test", "connection refused"), logging.INFO),
        (UpstreamBadResponse("test", "garbage"), logging.WARNING),
    ],
    ids=["upstream-down-at-info", "bad-answer-at-warning"],
)
async def test_a_failing_poll_logs_one_line_per_failure_streak_and_one_per_ten_seconds_for_all_watches(
    failure: UpstreamError, level: int, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(poller, "_error_log_limiter", LogLimiter(10.0))

    async def read(_: Watch) -> Observation | None:
        raise failure

    first, second = _watch(read), _watch(read, key=WatchKey("resource", "x://2", "public"))
    with caplog.at_level(logging.INFO, logger="sidecar.watch.poller"):
        await first.poll_once(due=0.0)
        lines = [r for r in caplog.records if r.name == "sidecar.watch.poller"]
        assert [(r.getMessage(), r.levelno) for r in lines] == [("poll failed; backing off", level)]
        await first.poll_once(due=0.0)  # the same streak
        await second.poll_once(due=0.0)  # another watch, within the ten seconds
    lines = [r for r in caplog.records if r.name == "sidecar.watch.poller"]
    assert len(lines) == 1
    fields = {name: getattr(lines[0], name, None) for name in ("watch", "kind", "reason")}
    assert fields == {"watch": first.key.short_hash, "kind": "resource", "reason": failure.reason}


async def test_a_poll_span_links_the_writes_that_hinted_it_and_names_the_uri_only_of_a_public_watch(
    spans: InMemorySpanExporter,
) -> None:
    tracer = trace.get_tracer("tests", tracer_provider=TracerProvider())
    writes = []
    for n in range(MAX_LINKS + 2):
        with tracer.start_as_current_span(f"write {n}") as span:
            writes.append(trace.Link(span.get_span_context()))

    async def read(_: Watch) -> Observation | None:
        return Observation("fp-1", None, True)

    clock = _Clock()
    public = _watch(read, clock=clock)
    private = _watch(read, clock=clock, key=WatchKey("resource", "x://alice", "ctx-alice"))
    public.hint(writes[:5])
    public.hint(writes[5:])
    await public.poll_once(due=0.0)
    await private.poll_once(due=0.0)
    polls = [span for span in spans.get_finished_spans() if span.name == "poll"]
    assert [dict(span.attributes or {}) for span in polls] == [
        {"mcp_sidecar.watch": public.key.short_hash, "mcp_sidecar.kind": "resource", "mcp_sidecar.uri": "x://1"},
        {"mcp_sidecar.watch": private.key.short_hash, "mcp_sidecar.kind": "resource"},
    ]
    assert [link.context for link in polls[0].links] == [write.context for write in writes[:MAX_LINKS]]
    assert list(polls[1].links) == []
    changes = [span for span in spans.get_finished_spans() if span.name == "change"]
    assert [dict(span.attributes or {}) for span in changes] == [
        {"mcp_sidecar.watch": watch.key.short_hash, "mcp_sidecar.kind": "resource", "mcp_sidecar.generation": 1}
        for watch in (public, private)
    ]
    assert all(
        change.parent is not None and change.parent.span_id == poll.context.span_id
        for change, poll in zip(changes, polls, strict=True)
    )


async def test_the_hold_before_publishing_seam_logs_the_line_the_replica_tests_wait_for_then_holds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # tests/replicas/test_replica_coherence.py kills an owner once it logs this line (the seam is on only
    # under MCP_SIDECAR_TEST_HOLD_BEFORE_PUBLISH=1).
    with caplog.at_level(logging.WARNING, logger="sidecar.watch.poller"):
        hold = asyncio.create_task(poller._hold())
        await asyncio.sleep(0)
    assert not hold.done(), "it holds the change for ever"
    hold.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await hold
    lines = [r.getMessage() for r in caplog.records if r.name == "sidecar.watch.poller"]
    assert lines == ["holding a change before publishing it (MCP_SIDECAR_TEST_HOLD_BEFORE_PUBLISH)"]
