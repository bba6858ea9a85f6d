"""Upstream faults, injected at the socket level by `tests/peers/faulty.py`: what a client sees, what other
clients see, and how often the sidecar goes back to a failing upstream.

For each fault a client gets a JSON-RPC error saying what failed in a fixed phrase, with an error id whose log
line names the upstream and a short reason (never the upstream's body, headers or a traceback), other clients
are served meanwhile, and a watch hit by the
fault backs off: the upstream sees at most the polls the backoff schedule allows in a window, even
while other clients' requests succeed in between (each success is evidence the upstream is "back").
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from sidecar.app import METRICS, REGISTRY
from sidecar.config import PollingConfig
from tests.kit import (
    WAIT_S,
    ListenStream,
    Sidecar,
    eventually,
    headers,
    parse_sse,
    request,
    rpc,
    serve_sidecar,
    told,
    waits,
)
from tests.peers.faulty import Fault, FaultyUpstream

LIMIT = 64 * 1024
"""upstream.max_response_bytes of every sidecar here."""
TIMEOUT_S = 0.5
"""upstream.timeout_s: a hang is noticed within half a second."""
POLLING = {"default_interval_ms": 300, "min_interval_ms": 100, "max_interval_ms": 300, "linger_ms": 100}
POLLING |= {"backoff_initial_ms": 200, "backoff_max_ms": 1600, "jitter": 0.1}
WINDOW_S = 4.0
"""How long a watch is watched failing; a healthy watch polls about 13 times in it, a storm 30 or more."""
UPSTREAM = {"timeout_s": TIMEOUT_S, "max_response_bytes": LIMIT}
LEAKS = ("Traceback", "secret_internals", "hunter2", "10.0.0.7", "app-7.internal", "<html")
"""What the upstream's error page and headers show; none of it may reach a client."""

FAULTS: dict[Fault, tuple[int, str]] = {
    Fault.RESET_MID_BODY: (
        502,
        r"truncated or malformed body|connection closed before the answer was complete|connection error: .+",
    ),
    Fault.HANG: (504, r"no answer in time|no complete answer within [0-9.]+ s"),
    Fault.HTML_500: (502, r"HTTP 500 Internal Server Error"),
    Fault.HTML_502: (502, r"HTTP 502 Bad Gateway"),
    Fault.NOT_JSON: (502, r"answer is not JSON"),
    Fault.TRUNCATED_SSE: (200, r"truncated or malformed body"),
    Fault.OVERSIZED_JSON: (502, rf"response larger than {LIMIT} bytes"),
    Fault.OVERSIZED_SSE: (200, rf"SSE event larger than {LIMIT} bytes"),
}
"""HTTP status and reason a client sees. An SSE answer has sent its 200 before it breaks off: its last event
is then the JSON-RPC error."""
POLL_FAULTS = [fault for fault in Fault if fault not in (Fault.SESSION_404, Fault.CLOSED_WHEN_REUSED)]


@pytest.fixture
async def up() -> AsyncIterator[FaultyUpstream]:
    async with FaultyUpstream(ttl_ms=300, oversize_bytes=4 * LIMIT) as upstream:
        yield upstream


@pytest.fixture(autouse=True)
def no_tracebacks(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Every test: the sidecar never logs an unexpected failure (a bug turned into a 500) while faults happen."""
    caplog.set_level(logging.INFO)
    yield
    crashes = [
        record.getMessage()
        for record in caplog.records
        if record.name.startswith("sidecar") and (record.exc_info or "unexpected failure" in record.getMessage())
    ]
    assert crashes == []


async def _read(http: aiohttp.ClientSession, sidecar: Sidecar, uri: str, request_id: Any, **extra: str) -> Any:
    """(status, last JSON-RPC message, raw text) of one read; an SSE answer must consist of whole JSON events."""
    body = request("resources/read", {"uri": uri}, request_id)
    async with http.post(sidecar.url, json=body, headers=headers("resources/read", uri, **extra)) as resp:
        text = await resp.text()
        if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
            return resp.status, parse_sse(text)[-1], text + str(dict(resp.headers))
        return resp.status, json.loads(text), text + str(dict(resp.headers))


def _assert_says(
    message: dict[str, Any], request_id: Any, upstream: FaultyUpstream, reason: str, log: list[logging.LogRecord]
) -> None:
    """The client is told what failed and an error id, never the upstream's address; the log line with that id
    names the upstream and a short reason."""
    assert message["id"] == request_id, message
    error = message["error"]
    assert error["code"] == -32603
    assert list(error["data"]) == ["error_id"] and upstream.url not in json.dumps(error), error
    assert error["message"].startswith("the upstream "), error
    logged = told(error, log)
    assert logged["upstream"] == upstream.url and re.fullmatch(reason, logged["reason"]), logged
    assert len(logged["reason"]) < 120, "a short reason, not a dump"


async def _bystanders(http: aiohttp.ClientSession, sidecar: Sidecar, tag: str, count: int = 20) -> None:
    """`count` other clients reading healthy resources at once; each must be served."""

    async def one(n: int) -> None:
        status, message, _ = await _read(http, sidecar, f"ok://{tag}/{n}", f"{tag}-{n}")
        assert status == 200, message
        assert message["result"]["contents"][0]["text"] == f"content of ok://{tag}/{n}"

    await asyncio.gather(*(one(n) for n in range(count)))


# -- a forwarded request hit by a fault --------------------------------------------------------------------


@pytest.mark.invariant(15)
@pytest.mark.parametrize("fault", list(FAULTS), ids=[fault.value for fault in FAULTS])
async def test_a_forwarded_request_hit_by_a_fault_gets_an_error_saying_what_happened_and_others_are_served(
    fault: Fault, up: FaultyUpstream, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    status_due, reason = FAULTS[fault]
    up.fail(fault, uri="fault://x")
    async with serve_sidecar(up.url, upstream=UPSTREAM, polling=POLLING) as sidecar:
        faulted = asyncio.create_task(_read(http, sidecar, "fault://x", "victim"))
        await _bystanders(http, sidecar, "during")  # served while the fault is under way
        status, message, raw = await asyncio.wait_for(faulted, WAIT_S)
        assert status == status_due, raw
        _assert_says(message, "victim", up, reason, caplog.records)
        for leak in LEAKS:
            assert leak not in raw, f"{leak!r} reached the client"
        await _bystanders(http, sidecar, "after")  # and the sidecar is fine afterwards
        assert [entry.fault for entry in up.reads("fault://x")] == [fault]  # one request upstream, no retries


async def test_a_read_on_a_kept_alive_connection_the_upstream_closed_is_sent_again_and_a_tool_call_never_is(
    up: FaultyUpstream, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    # A server's idle timeout can cross the next request on a kept-alive connection: closed, not a byte of
    # answer. A read may be sent again on a fresh connection (RFC 9112 section 9.3.1); a tool call may have run
    # and must not run twice: its client gets the error instead.
    async with serve_sidecar(up.url, upstream=UPSTREAM, polling=POLLING) as sidecar:
        status, message = await rpc(http, sidecar.url, "tools/call", {"name": "echo", "arguments": {"text": "warm"}})
        assert status == 200, message  # a connection now waits in the pool, and serves the next request
        up.fail(Fault.CLOSED_WHEN_REUSED, uri="again://x")
        status, message, raw = await _read(http, sidecar, "again://x", "read")
        assert status == 200, raw
        assert message["result"]["contents"][0]["text"] == "content of again://x"
        assert [entry.fault for entry in up.reads("again://x")] == [Fault.CLOSED_WHEN_REUSED, None]

        up.fail(Fault.CLOSED_WHEN_REUSED, methods=frozenset({"tools/call"}))
        status, message = await rpc(http, sidecar.url, "tools/call", {"name": "echo", "arguments": {"text": "once"}})
        assert status == 502, message
        assert told(message["error"], caplog.records)["reason"] == "connection closed before the answer was complete"
        assert len(up.seen(lambda entry: entry.method == "tools/call")) == 2, "the warm-up and this one, once"


async def test_connection_refused_is_a_prompt_error_for_everyone_and_service_resumes_when_the_upstream_returns(
    up: FaultyUpstream, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    async with serve_sidecar(up.url, upstream=UPSTREAM, polling=POLLING) as sidecar:
        await _bystanders(http, sidecar, "before")
        await up.stop()  # nothing listens on its port any more, and pooled connections are gone
        answers = await asyncio.gather(*(_read(http, sidecar, f"ok://down/{n}", f"down-{n}") for n in range(10)))
        # Refused at once, said as such: a timeout would be 504 "no answer in time".
        for n, (status, message, raw) in enumerate(answers):
            assert status == 502, raw
            _assert_says(message, f"down-{n}", up, r"cannot connect: .+", caplog.records)
        async with http.get(f"{sidecar.base_url}/healthz") as resp:
            assert resp.status == 200  # the process is fine...
        async with http.get(f"{sidecar.base_url}/readyz") as resp:
            assert resp.status == 503  # ...and says the upstream is not, and no more, to a client
            assert await resp.json() == {"status": "not ready"}
        async with http.get(f"{sidecar.admin_url}/readyz") as resp:
            assert resp.status == 503  # the admin listener says why
            assert "cannot connect" in (await resp.json())["reason"]
        await up.start()  # same port
        await _bystanders(http, sidecar, "back")


# -- a watch hit by a fault backs off ---------------------------------------------------------------------------


def _backoff_bound(window_s: float, polling: dict[str, Any]) -> int:
    """The most polls of one failing watch that can start within `window_s` under the backoff schedule (each
    delay at its shortest jitter), plus one already on its way when the fault began and one early retry when
    the upstream is seen to answer again."""
    config = PollingConfig.model_validate(polling)
    low = 1 - max(config.jitter, 0.1)
    elapsed, polls = 0.0, 1
    while True:
        elapsed += low * min(config.backoff_max_ms, config.backoff_initial_ms * 2 ** (polls - 1)) / 1000
        if elapsed > window_s:
            return polls + 2
        polls += 1


@pytest.mark.invariant(9)
@pytest.mark.parametrize("fault", POLL_FAULTS, ids=[fault.value for fault in POLL_FAULTS])
async def test_a_watch_hit_by_a_fault_backs_off_while_other_clients_are_served_and_recovers_after(
    fault: Fault, up: FaultyUpstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(up.url, upstream=UPSTREAM, polling=POLLING) as sidecar:
        stream = ListenStream(http, sidecar.url, "w", ["fault://w"])
        ack = await stream.open()
        try:
            assert ack["params"]["notifications"]["resourceSubscriptions"] == ["fault://w"]
            rule = up.fail(fault, uri="fault://w")
            first = len(up.requests)  # by position: uvloop's loop.time() is the same all through one loop turn
            loop = asyncio.get_running_loop()
            started = loop.time()
            rounds = 0
            while loop.time() < started + WINDOW_S:
                # Other clients keep succeeding meanwhile: each success shows the upstream answering again.
                await _bystanders(http, sidecar, f"r{rounds}", count=3)
                rounds += 1
                await asyncio.sleep(0.05)  # paces the bystanders; the window is what is measured
            window_s = loop.time() - started  # the last round may end past WINDOW_S on a busy machine
            polls = [
                entry for entry in up.requests[first:] if entry.method == "resources/read" and entry.uri == "fault://w"
            ]
            bound = _backoff_bound(window_s, POLLING)
            assert 2 <= len(polls) <= bound, f"{len(polls)} polls in {window_s:.1f} s; the schedule allows {bound}"
            assert {entry.fault for entry in polls} == {fault}
            # The point of the bystanders: successes reached the upstream between the watch's failing polls,
            # and still the watch kept backing off.
            served = [entry for entry in up.reads(since=started) if (entry.uri or "").startswith("ok://r")]
            assert any(polls[0].arrived < entry.arrived < polls[-1].arrived for entry in served), (
                "no other client was served between the failing polls"
            )
            errors = sidecar.app[METRICS].polls.labels("resource", "error")._value.get()
            assert errors >= len(polls) - 1

            # Backing off is not giving up: healed and changed, the watch notices within its longest backoff.
            up.heal(rule)
            up.contents["fault://w"] = "changed"
            update = await stream.next()
            assert update["method"] == "notifications/resources/updated" and update["params"]["uri"] == "fault://w"
            status, message, _ = await _read(http, sidecar, "fault://w", "reread")
            assert status == 200 and message["result"]["contents"][0]["text"] == "changed"
        finally:
            await stream.close()


async def test_a_watch_of_an_upstream_that_refuses_connections_backs_off_and_catches_up_when_it_returns(
    up: FaultyUpstream, http: aiohttp.ClientSession
) -> None:
    # Nothing reaches a stopped upstream to be counted there: the sidecar's own count of failed polls says it.
    async with serve_sidecar(up.url, upstream=UPSTREAM, polling=POLLING) as sidecar:
        stream = ListenStream(http, sidecar.url, "r", ["ok://r"])
        await stream.open()
        try:
            failed = sidecar.app[METRICS].polls.labels("resource", "error")
            await up.stop()
            up.contents["ok://r"] = "changed while refused"
            await eventually(lambda: failed._value.get() >= 1, within_s=WAIT_S)
            first = failed._value.get()
            await asyncio.sleep(WINDOW_S)  # negative check: a window in which a storm would show
            polls = failed._value.get() - first + 1
            bound = _backoff_bound(WINDOW_S, POLLING)
            assert 2 <= polls <= bound, f"{polls} polls in {WINDOW_S} s; the schedule allows {bound}"
            async with http.get(f"{sidecar.base_url}/readyz") as resp:
                assert resp.status == 503

            await up.start()
            update = await stream.next()  # the change made meanwhile, once the upstream answers again
            assert update["params"]["uri"] == "ok://r"
            status, message, _ = await _read(http, sidecar, "ok://r", "reread")
            assert status == 200 and message["result"]["contents"][0]["text"] == "changed while refused"
        finally:
            await stream.close()


# -- the re-initialize storm: a 2025-11-25 upstream that forgets every session at once ---------------------


async def test_an_upstream_that_answers_every_session_with_404_costs_bounded_retries_and_spares_other_contexts(
    http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    async with FaultyUpstream(era="legacy") as up, serve_sidecar(up.url, upstream=UPSTREAM, polling=POLLING) as sidecar:
        alice, bob = {"Authorization": "Bearer alice"}, {"Authorization": "Bearer bob"}
        for who, auth in (("a", alice), ("b", bob)):
            status, message, _ = await _read(http, sidecar, f"res://{who}", f"{who}-0", **auth)
            assert status == 200 and message["result"]["resultType"] == "complete", message
        stream = ListenStream(http, sidecar.url, "a-watch", ["res://a"], authorization="Bearer alice")
        await stream.open()
        try:
            up.fail(Fault.SESSION_404, token="alice", methods=None)
            started = asyncio.get_running_loop().time()

            answers = await asyncio.gather(
                *(_read(http, sidecar, f"res://a/{n}", f"a-{n}", **alice) for n in range(10))
            )
            for n, (status, message, raw) in enumerate(answers):
                assert status == 502, raw
                _assert_says(message, f"a-{n}", up, r"HTTP 404 Not Found", caplog.records)
            client_reads = [entry for entry in up.reads(since=started) if (entry.uri or "").startswith("res://a/")]
            assert len(client_reads) <= 2 * 10, "each request is retried at most once on a fresh session"

            # Bob's session is untouched: served, and never initialized again.
            bob_inits = len(up.seen(lambda e: e.method == "initialize" and e.authorization == "Bearer bob"))
            for n in range(5):
                status, message, _ = await _read(http, sidecar, f"res://b/{n}", f"b-{n}", **bob)
                assert status == 200, message
            assert len(up.seen(lambda e: e.method == "initialize" and e.authorization == "Bearer bob")) == bob_inits

            # The watch of Alice's resource backs off: each poll is at most one re-initialize and two reads.
            await asyncio.sleep(WINDOW_S)  # negative check: a window in which a storm would show
            bound = _backoff_bound(WINDOW_S, POLLING)
            polls = up.reads("res://a", since=started)
            inits = up.seen(lambda e: e.method == "initialize" and e.authorization == "Bearer alice", since=started)
            assert 1 <= len(polls) <= 2 * bound, f"{len(polls)} reads of the watched resource; bound {2 * bound}"
            assert len(inits) <= 10 + bound, f"{len(inits)} initializes"
        finally:
            await stream.close()


# -- a slow upstream: polls never overlap per key and stay within max_concurrency ----------------------------


async def test_with_a_slow_upstream_polls_never_overlap_per_key_and_stay_within_max_concurrency(
    http: aiohttp.ClientSession,
) -> None:
    concurrency, watches, delay_s = 25, 500, 2.0
    # One client subscribing to 500 resources at once: far past the per-client rate of first reads.
    polling = {**POLLING, "max_concurrency": concurrency, "linger_ms": 5000, "max_baselines_per_s": 10_000}
    async with FaultyUpstream(ttl_ms=100) as up, serve_sidecar(up.url, polling=polling) as sidecar:
        uris = [f"slow://{n}" for n in range(watches)]
        streams = [ListenStream(http, sidecar.url, f"s{k}", uris[k::5]) for k in range(5)]
        try:
            for stream in streams:
                ack = await stream.open()
                assert len(ack["params"]["notifications"]["resourceSubscriptions"]) == watches // 5
            assert len(list(sidecar.app[REGISTRY].watches())) == watches
            up.read_delay_s = delay_s
            up.delays["fast://x"] = 0.0
            started = asyncio.get_running_loop().time()

            # Writes through the sidecar hint every watch to poll at once: the hints must queue, not pile up.
            for _ in range(10):
                status, reply = await rpc(http, sidecar.url, "tools/call", {"name": "echo", "arguments": {"text": "x"}})
                assert status == 200, reply
            # A client's own read is not a poll: it runs beside a spent poll budget instead of waiting for a slot,
            # so while it is answered (slowly, on purpose) the upstream has one more read in flight than polls may.
            await eventually(lambda: up.inflight_total >= concurrency, within_s=WAIT_S)
            up.delays["fast://x"] = 0.5
            up.max_inflight_total = 0
            status, message, _ = await _read(http, sidecar, "fast://x", "fast")
            assert status == 200, message
            assert up.max_inflight_total > concurrency, f"the read waited for a poll slot ({up.max_inflight_total})"
            up.max_inflight_total = up.max_inflight_per_uri = 0  # from here on, only polls are in flight

            await eventually(lambda: up.max_inflight_total >= concurrency, within_s=WAIT_S)
            await asyncio.sleep(3 * delay_s)  # negative check: three rounds of slow polls, none may overlap
            polls = [entry for entry in up.reads(since=started) if entry.by_sidecar]
            assert len(polls) >= 2 * concurrency
            assert up.max_inflight_per_uri == 1, "two polls of one key were in flight at once"
            assert up.max_inflight_total <= concurrency
            assert waits(sidecar, "poll_concurrency") > 0
        finally:
            for stream in streams:
                await stream.close()


# -- era detection: a transport failure is no verdict ------------------------------------------------------


@pytest.mark.parametrize("fault", [Fault.HTML_502, Fault.RESET_MID_BODY, None], ids=["502", "reset", "refused"])
async def test_a_transport_failure_on_server_discover_decides_no_era(
    http: aiohttp.ClientSession, fault: Fault | None
) -> None:
    # Only a refusal from the server itself (a JSON-RPC error, a 4xx) says "not 2026-07-28": a gateway's 502, a
    # reset or a refused connection says nothing, so no initialize may follow it (a 2026-07-28 server that also
    # speaks 2025-11-25 would answer it and be driven as legacy from then on).
    async with FaultyUpstream(era="legacy") as up:
        # The fault is there before the sidecar starts: its own start-up probe meets it first.
        if fault is None:
            await up.stop()
        else:
            up.fail(fault, methods=frozenset({"server/discover"}))
        async with serve_sidecar(up.url, upstream=UPSTREAM) as sidecar:
            await _no_era_decided_until_healed(http, up, sidecar, fault)


async def _no_era_decided_until_healed(
    http: aiohttp.ClientSession, up: FaultyUpstream, sidecar: Sidecar, fault: Fault | None
) -> None:
    for _ in range(2):
        async with http.get(f"{sidecar.base_url}/readyz") as resp:
            assert resp.status == 503
    assert [seen.method for seen in up.seen() if seen.method == "initialize"] == []
    if fault is None:
        await up.start()
    else:
        up.heal()

    async def ready() -> bool:
        async with http.get(f"{sidecar.base_url}/readyz") as resp:
            return resp.status == 200

    await eventually(ready, within_s=WAIT_S)
    status, message, _ = await _read(http, sidecar, "res://after", "after")
    assert status == 200 and message["result"]["resultType"] == "complete", message
