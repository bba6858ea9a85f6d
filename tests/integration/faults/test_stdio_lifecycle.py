"""A stdio upstream's life: restarts, bad output, floods, stubborn processes, bounds, and what clients see of it.

Each test starts its own sidecar in this process, with a real child: the SDK 2.3 file server for the
kill -9 test, the hand-written toy server (tests/peers/stdio_toy_server.py) for the misbehaviour.
Waits are on events or on observable state with a timeout; nothing sleeps to let behaviour happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from mcp import Client
from mcp.client.subscriptions import ResourceUpdated

from sidecar.app import FAIR_SHARE, UPSTREAM, build_app
from sidecar.upstream.stdio.client import StdioUpstream
from sidecar.upstream.stdio.process import StdioStartError
from tests.kit import WAIT_S, ListenStream, eventually, headers, readyz, request, rpc, scrape, sse_messages, told
from tests.peers.stdio_notes_server import NOTE_URI
from tests.peers.stdio_peers import (
    live_processes,
    notes_command,
    serve_stdio_sidecar,
    session_members,
    stdio_config,
    toy_command,
)

FAST = {"min_interval_ms": 100, "default_interval_ms": 300, "max_interval_ms": 300, "linger_ms": 100}
QUICK_RESTART = {"restart_backoff_initial_ms": 1500, "restart_backoff_max_ms": 3000, "stop_grace_s": 2.0}
"""Long enough a backoff to look at the sidecar while the child is down; short enough for a test."""


def _upstream(sidecar: Any) -> StdioUpstream:
    upstream = sidecar.app[UPSTREAM]
    assert isinstance(upstream, StdioUpstream)
    return upstream


async def _tool_text(http: aiohttp.ClientSession, url: str, name: str, **arguments: Any) -> str:
    status, reply = await rpc(http, url, "tools/call", {"name": name, "arguments": arguments})
    assert status == 200 and "result" in reply, reply
    text: str = reply["result"]["content"][0]["text"]
    return text


@pytest.mark.invariant(14)
async def test_kill_9_mid_listen_restarts_the_child_and_the_change_made_while_down_is_told(
    tmp_path: Path, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    note = tmp_path / "note.txt"
    note.write_text("before", encoding="utf-8")
    sections = {"polling": FAST, "upstream": QUICK_RESTART}
    async with (
        serve_stdio_sidecar(notes_command(note, read_ttl_ms=300), **sections) as sidecar,
        Client(sidecar.url, cache=None) as client,
        client.listen(resource_subscriptions=[NOTE_URI]) as subscription,
    ):
        first_pid = int((await client.call_tool("server_pid")).content[0].text)  # type: ignore[union-attr]
        os.kill(first_pid, signal.SIGKILL)

        async def down() -> bool:
            status, body = await readyz(http, sidecar.admin_url)
            return status == 503 and "killed by SIGKILL" in body["reason"]

        await eventually(down, within_s=WAIT_S)
        note.write_text("changed while the server was down", encoding="utf-8")
        status, refused = await rpc(http, sidecar.url, "tools/call", {"name": "server_pid", "arguments": {}})
        assert status == 502 and "killed by SIGKILL" in told(refused["error"], caplog.records)["reason"], refused

        async with asyncio.timeout(WAIT_S):
            event = await anext(subscription)  # the stream stayed open through the outage
        assert event == ResourceUpdated(uri=NOTE_URI)
        assert (await client.read_resource(NOTE_URI)).contents[0].text == "changed while the server was down"  # type: ignore[union-attr]
        second_pid = int((await client.call_tool("server_pid")).content[0].text)  # type: ignore[union-attr]
        assert second_pid != first_pid
        assert (await readyz(http, sidecar.admin_url))[0] == 200
        metrics = await scrape(http, sidecar.admin_url)
        assert metrics.value("mcp_sidecar_upstream_restarts_total", reason="exited") == 1
    assert live_processes([first_pid, second_pid]) == []


async def test_garbage_on_stdout_is_skipped_and_counted(
    http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sidecar.upstream.stdio.child")
    async with serve_stdio_sidecar(toy_command("--garbage")) as sidecar:
        for word in ("one", "two", "three"):
            assert await _tool_text(http, sidecar.url, "echo", text=word) == word
        metrics = await scrape(http, sidecar.admin_url)
        assert (metrics.value("mcp_sidecar_upstream_bad_lines_total") or 0) >= 4  # the banner and one per answer
        assert metrics.value("mcp_sidecar_upstream_restarts_total", reason="exited") == 0
    warnings = [record for record in caplog.records if "not JSON-RPC" in record.getMessage()]
    assert 1 <= len(warnings) <= 2  # rate-limited to one per 10 s: the rest are counted
    assert warnings[0].__dict__["sample"].startswith("toy server starting")


async def test_a_child_flooding_stderr_is_drained_and_its_log_rate_limited(
    http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.upstream.stdio.stderr")
    flood = 100_000  # ~2.5 MB: a pipe nobody reads (64 KiB) would block the child before its first answer
    sections = {"upstream": {"stderr_lines_per_s": 5}}
    async with serve_stdio_sidecar(toy_command("--stderr-flood", str(flood)), **sections) as sidecar:
        assert await _tool_text(http, sidecar.url, "echo", text="still answering") == "still answering"

        async def drained() -> bool:
            metrics = await scrape(http, sidecar.admin_url)
            logged = metrics.value("mcp_sidecar_upstream_stderr_lines_total", outcome="logged") or 0
            dropped = metrics.value("mcp_sidecar_upstream_stderr_lines_total", outcome="dropped") or 0
            return logged + dropped == flood

        await eventually(drained, within_s=WAIT_S)
        metrics = await scrape(http, sidecar.admin_url)
    logged = [record for record in caplog.records if record.name == "sidecar.upstream.stdio.stderr"]
    lines = [record for record in logged if record.getMessage().startswith("stderr flood line")]
    assert 0 < len(lines) < flood // 100
    assert lines[0].getMessage() == "stderr flood line 0"  # marked as the child's by its logger, in order
    assert metrics.value("mcp_sidecar_upstream_stderr_lines_total", outcome="logged") == len(lines)


@pytest.mark.parametrize(
    "wrapping",
    [
        pytest.param([], id="plain"),
        pytest.param(["--ignore-sigterm"], id="ignores-sigterm"),
        pytest.param(["--wrapper"], id="python-wrapper-ignoring-sigterm"),
        pytest.param(["--wrapper", "--ignore-sigterm"], id="python-wrapper-and-server-ignoring-sigterm"),
        pytest.param(["sh"], id="sh-c-wrapper"),
    ],
)
async def test_stopping_the_sidecar_leaves_no_process_of_the_child_behind(
    tmp_path: Path, http: aiohttp.ClientSession, wrapping: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    pids = tmp_path / "pids"
    command = toy_command("--pid-file", str(pids), *[flag for flag in wrapping if flag != "sh"])
    if wrapping == ["sh"]:
        # Not `exec`: sh stays as the server's parent, as npx's and uvx's shells do.
        command = ["sh", "-c", shlex.join(command) + "; true"]
    caplog.set_level(logging.WARNING, logger="sidecar.upstream.stdio.child")
    async with serve_stdio_sidecar(command, upstream={"stop_grace_s": 0.5}) as sidecar:
        assert await _tool_text(http, sidecar.url, "echo", text="up") == "up"
        group = _upstream(sidecar).pid
        assert group is not None
        members = session_members(group)
        started = [int(line) for line in pids.read_text().split()]
        wrapped = "--wrapper" in wrapping or "sh" in wrapping
        assert set(started) <= set(members) and len(members) == (2 if wrapped else 1)
    assert live_processes(members) == []
    assert session_members(group) == []
    stubborn = "--ignore-sigterm" in wrapping  # the others end on SIGTERM to the group, the wrapper with its child
    killed = [record for record in caplog.records if "sending SIGKILL to its process group" in record.getMessage()]
    assert len(killed) == (1 if stubborn else 0)


async def test_a_hung_child_is_ended_and_started_again(
    http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    # Two seconds to answer a ping even on a loaded machine; half a second for the tools that never answer.
    sections = {"upstream": {"timeout_s": 0.5, "connect_timeout_s": 2.0, "restart_backoff_initial_ms": 50}}
    async with serve_stdio_sidecar(toy_command(), **sections) as sidecar:
        first = await _tool_text(http, sidecar.url, "pid")
        # A tool that never answers is slow, not dead: the child still answers the liveness probe.
        status, slow = await rpc(http, sidecar.url, "tools/call", {"name": "hang", "arguments": {}})
        assert status == 504 and "no answer in time" in told(slow["error"], caplog.records)["reason"], slow
        assert await _tool_text(http, sidecar.url, "pid") == first
        # A child that reads nothing more is dead to us: ended, and started again.
        status, frozen = await rpc(http, sidecar.url, "tools/call", {"name": "freeze", "arguments": {}})
        assert status == 504, frozen

        async def restarted() -> bool:
            metrics = await scrape(http, sidecar.admin_url)
            return metrics.value("mcp_sidecar_upstream_restarts_total", reason="unresponsive") == 1

        await eventually(restarted, within_s=WAIT_S)
        await eventually(lambda: _upstream(sidecar).up is True, within_s=WAIT_S)
        assert await _tool_text(http, sidecar.url, "pid") != first


async def test_an_answer_over_max_response_bytes_fails_that_request_only(
    http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    async with serve_stdio_sidecar(toy_command(), upstream={"max_response_bytes": 4096}) as sidecar:
        status, reply = await rpc(http, sidecar.url, "tools/call", {"name": "big", "arguments": {"size": 100_000}})
        assert status == 502 and "response larger than 4096 bytes" in told(reply["error"], caplog.records)["reason"]
        assert await _tool_text(http, sidecar.url, "big", size=100) == "x" * 100
        metrics = await scrape(http, sidecar.admin_url)
        assert metrics.value("mcp_sidecar_limit_rejections_total", limit="upstream_max_response_bytes") == 1
        assert metrics.value("mcp_sidecar_upstream_restarts_total", reason="exited") == 0


@pytest.mark.invariant(20)
async def test_requests_over_the_childs_capacity_wait_their_turn_instead_of_being_refused(
    http: aiohttp.ClientSession,
) -> None:
    # Client requests may have max_in_flight less the polls' max_concurrency at the child: two here.
    upstream = {"max_in_flight": 4, "max_requests_per_client": 2, "timeout_s": 30}
    async with serve_stdio_sidecar(toy_command(), upstream=upstream, polling={"max_concurrency": 2}) as sidecar:
        hanging = [
            asyncio.create_task(rpc(http, sidecar.url, "tools/call", {"name": "hang", "arguments": {}}))
            for _ in range(2)
        ]
        try:
            await eventually(lambda: _in_flight(sidecar) == 2, within_s=WAIT_S)
            waiting = asyncio.create_task(_tool_text(http, sidecar.url, "echo", text="my turn"))
            await eventually(lambda: sidecar.app[FAIR_SHARE].queued == 1, within_s=WAIT_S)
            assert _in_flight(sidecar) == 2  # it waits here, not at the child
            hanging[0].cancel()  # a client leaves: its request is cancelled at the child and its slot handed on
            assert await waiting == "my turn"
        finally:
            for task in hanging:
                task.cancel()
            await asyncio.gather(*hanging, return_exceptions=True)
        await eventually(lambda: _in_flight(sidecar) == 0, within_s=WAIT_S)
        metrics = await scrape(http, sidecar.admin_url)
        assert metrics.value("mcp_sidecar_limit_rejections_total", limit="upstream_max_in_flight") == 0


def _in_flight(sidecar: Any) -> int:
    child = _upstream(sidecar)._stdio._supervisor.child
    return child.in_flight if child is not None else -1


async def test_the_childs_requests_are_refused_and_its_ping_answered(http: aiohttp.ClientSession) -> None:
    async with serve_stdio_sidecar(toy_command()) as sidecar:
        answer = json.loads(await _tool_text(http, sidecar.url, "sample"))
    assert answer == {"error": {"code": -32601, "message": "not available through mcp-sidecar"}}


async def test_progress_goes_to_the_request_that_asked_with_the_clients_own_token(
    http: aiohttp.ClientSession,
) -> None:
    async def call(request_id: int) -> list[dict[str, Any]]:
        body = request("tools/call", {"name": "slow", "arguments": {"steps": 2}}, request_id)
        body["params"]["_meta"] = {**body["params"]["_meta"], "progressToken": "same-token"}  # the same for both
        async with http.post(sidecar.url, json=body, headers=headers("tools/call", "slow")) as resp:
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            return [message async for message in sse_messages(resp)]

    async with serve_stdio_sidecar(toy_command()) as sidecar:
        first, second = await asyncio.gather(call(1), call(2))
    for request_id, messages in ((1, first), (2, second)):
        progress = [m["params"] for m in messages if m.get("method") == "notifications/progress"]
        assert progress == [
            {"progressToken": "same-token", "progress": 1, "total": 2},
            {"progressToken": "same-token", "progress": 2, "total": 2},
        ]
        assert messages[-1]["id"] == request_id and messages[-1]["result"]["content"][0]["text"] == "done after 2 steps"


async def test_a_legacy_clients_cancel_names_the_childs_id_for_its_request(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    received = tmp_path / "received.jsonl"
    legacy = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    async with serve_stdio_sidecar(toy_command("--received", str(received))) as sidecar:
        initialize = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"},
            },
        }
        async with http.post(sidecar.url, json=initialize, headers=legacy) as resp:
            assert resp.status == 200
            session = {**legacy, "Mcp-Session-Id": resp.headers["Mcp-Session-Id"], "MCP-Protocol-Version": "2025-11-25"}
            assert (await resp.json())["result"]["serverInfo"]["name"] == "stdio-toy"
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        async with http.post(sidecar.url, json=initialized, headers=session) as resp:
            assert resp.status == 202
        hang = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "hang", "arguments": {}}}
        waiting = asyncio.create_task(http.post(sidecar.url, json=hang, headers=session))
        try:
            await eventually(lambda: _in_flight(sidecar) == 1, within_s=WAIT_S)
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}
            async with http.post(sidecar.url, json=cancel, headers=session) as resp:
                assert resp.status == 202

            def seen() -> list[dict[str, Any]]:
                return [json.loads(line) for line in received.read_text().splitlines()]

            await eventually(lambda: any(m.get("method") == "notifications/cancelled" for m in seen()))
            async with asyncio.timeout(WAIT_S):  # the cancelled request does not wait out upstream.timeout_s
                answered = await waiting
                assert answered.status == 200 and "cancelled" in (await answered.json())["error"]["message"]
                answered.release()
        finally:
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
    messages = seen()
    call = next(m for m in messages if m.get("method") == "tools/call")
    cancelled = next(m for m in messages if m.get("method") == "notifications/cancelled")
    assert cancelled["params"]["requestId"] == call["id"]  # the child's id for it, not the client's 7
    # The child was initialized once, by the sidecar; the client's own handshake stayed with the sidecar.
    assert [m["method"] for m in messages if m.get("method") in ("initialize", "notifications/initialized")] == [
        "initialize",
        "notifications/initialized",
    ]


async def test_a_child_that_exits_on_discover_is_started_again_with_initialize(http: aiohttp.ClientSession) -> None:
    sections = {"upstream": {"restart_backoff_initial_ms": 50}}
    async with serve_stdio_sidecar(toy_command("--exit-on-discover"), **sections) as sidecar:
        await eventually(lambda: _upstream(sidecar).up is True, within_s=WAIT_S)
        assert await _tool_text(http, sidecar.url, "echo", text="second life") == "second life"
        info = _upstream(sidecar).info
        assert info is not None and info.era == "legacy"
        metrics = await scrape(http, sidecar.admin_url)
        assert metrics.value("mcp_sidecar_upstream_restarts_total", reason="exited") == 1


async def test_each_restart_asks_server_discover_again_and_only_a_death_after_reading_it_skips_it(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    received = tmp_path / "received.jsonl"
    sections = {"upstream": {"restart_backoff_initial_ms": 50}}
    command = toy_command("--exit-on-discover", "--received", str(received))
    async with serve_stdio_sidecar(command, **sections) as sidecar:
        await eventually(lambda: _upstream(sidecar).up is True, within_s=WAIT_S)
        os.kill(int(await _tool_text(http, sidecar.url, "pid")), signal.SIGKILL)  # it served, then died
        await eventually(lambda: _upstream(sidecar).up is False, within_s=WAIT_S)
        await eventually(lambda: _upstream(sidecar).up is True, within_s=WAIT_S)
        info = _upstream(sidecar).info
        assert info is not None and info.era == "legacy"
    handshakes = [
        message["method"]
        for message in map(json.loads, received.read_text().splitlines())
        if message.get("method") in ("server/discover", "initialize")
    ]
    # Each life but one after a death on server/discover is asked server/discover first: a newer server
    # (uvx fetches the latest) would be met in its own era.
    assert handshakes == ["server/discover", "initialize", "server/discover", "initialize"]


async def test_clients_authorization_is_ignored_and_everyone_shares_one_context(
    tmp_path: Path, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sidecar.downstream.shared_context")
    note = tmp_path / "note.txt"
    note.write_text("shared", encoding="utf-8")
    async with serve_stdio_sidecar(notes_command(note), polling=FAST) as sidecar:
        alice = ListenStream(http, sidecar.url, "a", [NOTE_URI], authorization="Bearer alice")
        bob = ListenStream(http, sidecar.url, "b", [NOTE_URI], authorization="Bearer bob")
        try:
            for stream in (alice, bob):
                assert (await stream.open())["params"]["notifications"]["resourceSubscriptions"] == [NOTE_URI]
            metrics = await scrape(http, sidecar.admin_url)
            assert metrics.value("mcp_sidecar_watches", kind="resource") == 1  # one context: one watch
            assert metrics.value("mcp_sidecar_watched_contexts") == 1
        finally:
            await alice.close()
            await bob.close()
    told = [record for record in caplog.records if "Authorization" in record.getMessage()]
    assert len(told) == 1
    assert "alice" not in caplog.text and "bob" not in caplog.text


async def test_a_command_that_cannot_start_fails_the_start_up_saying_why() -> None:
    app = build_app(stdio_config(["/nonexistent/mcp-server", "--flag"]))
    runner = web.AppRunner(app)
    with pytest.raises(StdioStartError, match=r"cannot start '/nonexistent/mcp-server': No such file or directory"):
        await runner.setup()
    await runner.cleanup()
