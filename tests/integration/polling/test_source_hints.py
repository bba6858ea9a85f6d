"""Hints from the source of truth: `POST /hints` on the admin listener, against a real SDK upstream.

The sidecar polls every ten minutes here, so only a hint can bring a change within the test's waits. A hint is
never a change (invariant 22): each hinted watch looks, with its own context's credential, and only a look that
sees different content notifies anyone. Here a hint asks for one look (`hints.settle_ms: 0`), so what each costs
is counted; the looks a hint keeps making while the watch is warm are `test_warm_hints`'s. The upstream counts
its reads, so "nothing was polled" is its word. The last tests run the sidecar as processes: `mcp-sidecar hint`
and a token rotated by SIGHUP, and replicas on a real redis-server, where a hint sent to one replica is looked
at by the replica that polls the key.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.app import METRICS
from tests.cluster import RedisServer, Replica, free_port, leases_held, sidecar_config, sidecar_replicas
from tests.kit import UPDATED, ListenStream, Sidecar, cli, eventually, listening, rpc, serve_sidecar
from tests.peers import Upstream, start_upstream
from tests.procs import child_env

PRICE = "catalog://price"
A1, B2 = "catalog://items/a1", "catalog://items/b2"
TOKEN = "s3cret-hint-token"
TEN_MINUTES = {"default_interval_ms": 600_000, "max_interval_ms": 600_000, "min_interval_ms": 10, "linger_ms": 100}
"""Only a hint (or a write) makes a watch look within a test's waits."""
HINT_WAIT_S = 10.0
"""Far below the ten-minute poll interval: a look in time came from a hint (or a write)."""


@pytest.fixture
async def shop() -> AsyncIterator[Upstream]:
    async with await start_upstream("modern", read_ttl_ms=0, list_ttl_ms=0) as up:
        yield up


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "hints-token"
    path.write_text(TOKEN + "\n", encoding="utf-8")
    return path


@pytest.fixture
async def sidecar(shop: Upstream, token_file: Path) -> AsyncIterator[Sidecar]:
    hints = {"token_file": str(token_file), "settle_ms": 0}
    async with serve_sidecar(shop.url, polling=TEN_MINUTES, hints=hints) as served:
        yield served


async def _hint(
    http: aiohttp.ClientSession, sidecar: Sidecar, body: Any, token: str | None = TOKEN, **kwargs: Any
) -> tuple[int, Any]:
    auth = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with http.post(f"{sidecar.admin_url}/hints", json=body, headers=auth, **kwargs) as resp:
        assert resp.headers["Content-Type"].startswith("application/json"), await resp.text()
        return resp.status, await resp.json()


def _outcomes(sidecar: Sidecar, outcome: str) -> float:
    return sidecar.app[METRICS].hints_received.labels(outcome)._value.get()


async def test_a_change_at_the_source_reaches_a_listener_within_one_hint(
    shop: Upstream, sidecar: Sidecar, http: aiohttp.ClientSession
) -> None:
    stream = ListenStream(http, sidecar.url, "l-1", [PRICE])
    async with listening(stream):
        await shop.set_price(150)  # at the source: nothing goes through the sidecar
        assert await _hint(http, sidecar, {"uris": [PRICE]}) == (202, {"hinted": 1, "warm_ms": 0})
        frame = await stream.next(within_s=HINT_WAIT_S)
        assert frame["method"] == UPDATED and frame["params"] == {"uri": PRICE, "_meta": frame["params"]["_meta"]}
        status, message = await rpc(http, sidecar.url, "resources/read", {"uri": PRICE})
        assert status == 200 and message["result"]["contents"][0]["text"] == "price=150"
        assert sidecar.app[METRICS].watches_hinted._value.get() == 1


async def test_a_missing_or_wrong_token_polls_nothing(
    shop: Upstream, sidecar: Sidecar, http: aiohttp.ClientSession
) -> None:
    stream = ListenStream(http, sidecar.url, "l-2", [PRICE])
    async with listening(stream):
        before = await shop.count("resources/read", PRICE)
        for token in (None, "wrong", TOKEN + "x", TOKEN[:-1]):
            status, body = await _hint(http, sidecar, {"uris": [PRICE]}, token=token)
            assert status == 401 and "token" in body["error"]
        async with http.post(
            f"{sidecar.admin_url}/hints", json={"uris": [PRICE]}, headers={"Authorization": f"Basic {TOKEN}"}
        ) as resp:
            assert resp.status == 401 and resp.headers["WWW-Authenticate"] == "Bearer"
        assert _outcomes(sidecar, "unauthorized") == 5
        # The right token polls: a refused hint that had polled would have read before this one.
        assert await _hint(http, sidecar, {"uris": [PRICE]}) == (202, {"hinted": 1, "warm_ms": 0})
        await eventually(lambda: _reads_over(shop, PRICE, before), within_s=HINT_WAIT_S)
        assert await shop.count("resources/read", PRICE) == before + 1


async def _reads_over(shop: Upstream, uri: str, count: int) -> bool:
    return await shop.count("resources/read", uri) > count


async def test_a_glob_hints_every_watch_it_matches(
    shop: Upstream, sidecar: Sidecar, http: aiohttp.ClientSession
) -> None:
    stream = ListenStream(http, sidecar.url, "l-3", [A1, B2, PRICE], toolsListChanged=True)
    async with listening(stream):
        await shop.set_price(160)  # every item's text names the price
        await shop.add("tool", "late_tool")
        status, body = await _hint(http, sidecar, {"uris": ["catalog://items/*"], "lists": ["tools"]})
        assert (status, body) == (202, {"hinted": 3, "warm_ms": 0})  # two items and the tool list; not the price
        told = {(await stream.next(within_s=HINT_WAIT_S))["params"].get("uri", "tools") for _ in range(3)}
        assert told == {A1, B2, "tools"}


@pytest.mark.invariant(22)
async def test_a_hint_for_an_unchanged_resource_notifies_nobody(
    shop: Upstream, sidecar: Sidecar, http: aiohttp.ClientSession
) -> None:
    stream = ListenStream(http, sidecar.url, "l-4", [A1, PRICE])
    async with listening(stream):
        before = await shop.count("resources/read", A1)
        assert await _hint(http, sidecar, {"uris": [A1]}) == (202, {"hinted": 1, "warm_ms": 0})  # nothing changed at A1
        await eventually(lambda: _reads_over(shop, A1, before), within_s=HINT_WAIT_S)  # the hint's look happened
        await shop.set_price(170)
        assert await _hint(http, sidecar, {"uris": [PRICE]}) == (202, {"hinted": 1, "warm_ms": 0})
        frame = await stream.next(within_s=HINT_WAIT_S)
        assert frame["params"]["uri"] == PRICE, "the false alarm never reached the client; the real change did"


@pytest.mark.parametrize(
    ("body", "wanted"),
    [
        (b"not json", "not JSON"),
        (b"[]", "JSON object"),
        (b'{"uri": "catalog://price"}', "unknown member"),
        (b'{"lists": ["tools"]}', "uris is missing"),
        (b'{"uris": "catalog://price"}', "uris must be a list"),
        (b'{"uris": [7]}', "uris must be a list"),
        (b'{"uris": [""]}', "uris must be a list"),
        (b'{"uris": [], "lists": ["tool"]}', "lists must be a list of"),
        (b'{"uris": []}', "names nothing"),
        (b'{"uris": [' + b",".join(b'"x://%d/*"' % n for n in range(101)) + b"]}", "at most 100"),
    ],
)
async def test_a_body_of_another_shape_is_a_json_400_and_polls_nothing(
    sidecar: Sidecar, http: aiohttp.ClientSession, body: bytes, wanted: str
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with http.post(f"{sidecar.admin_url}/hints", data=body, headers=headers) as resp:
        assert resp.status == 400
        assert wanted in (await resp.json())["error"]
    assert _outcomes(sidecar, "bad_request") == 1 and sidecar.app[METRICS].watches_hinted._value.get() == 0


async def test_a_body_over_64_kib_is_a_json_413_read_no_further(sidecar: Sidecar, http: aiohttp.ClientSession) -> None:
    uris = [f"catalog://items/{n:08}" for n in range(5000)]  # about 120 KiB
    status, body = await _hint(http, sidecar, {"uris": uris})
    assert status == 413 and "65536" in body["error"]

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: counted as it is read
        yield b'{"uris": ['
        for _ in range(3000):
            yield b'"catalog://items/aaaaaaaaaaaaaaaaaaaaaa",'
        yield b'"x"]}'

    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with http.post(f"{sidecar.admin_url}/hints", data=chunked(), headers=headers) as resp:
        assert resp.status == 413 and "error" in await resp.json()
    assert _outcomes(sidecar, "too_large") == 2


async def test_the_endpoint_is_only_on_the_admin_listener_and_only_with_a_token(
    shop: Upstream, sidecar: Sidecar, http: aiohttp.ClientSession
) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with http.post(f"{sidecar.base_url}/hints", json={"uris": [PRICE]}, headers=auth) as resp:
        assert resp.status == 404  # not on the MCP port
    async with http.get(f"{sidecar.admin_url}/hints", headers=auth) as resp:
        assert resp.status == 405 and "error" in await resp.json()
    async with (
        serve_sidecar(shop.url) as plain,
        http.post(f"{plain.admin_url}/hints", json={"uris": [PRICE]}, headers=auth) as resp,
    ):
        assert resp.status == 404  # no token configured: no such endpoint


async def test_a_burst_of_writes_costs_at_most_two_reads(shop: Upstream, http: aiohttp.ClientSession) -> None:
    # A window longer than the burst: the first write looks at once, the others are one look at the window's end.
    # (Written one after another, each over min_interval_ms after the last: a look per write would show.)
    polling = {**TEN_MINUTES, "revalidate_debounce_ms": 3000}
    async with serve_sidecar(shop.url, polling=polling, hints={"settle_ms": 0}) as sidecar:
        stream = ListenStream(http, sidecar.url, "l-5", [PRICE])
        async with listening(stream):
            before = await shop.count("resources/read", PRICE)
            for n in range(10):
                status, message = await rpc(
                    http, sidecar.url, "tools/call", {"name": "echo", "arguments": {"text": f"write {n}"}}
                )
                assert status == 200 and "result" in message
            await eventually(lambda: _reads_over(shop, PRICE, before + 1), within_s=HINT_WAIT_S)  # the trailing look
            assert await shop.count("resources/read", PRICE) == before + 2


# -- as processes: the command, the token's rotation, replicas ------------------------------------------------


async def _leases_of(replica: Replica, count: int) -> bool:
    return await leases_held([replica]) == [count]


def _written(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


async def _cli_hint(admin_port: int, token_file: Path, *uris: str) -> tuple[int, str, str]:
    argv = ["hint", *uris, "--admin-url", f"http://127.0.0.1:{admin_port}", "--token-file", str(token_file)]
    code, out, err = await _cli_run(argv)
    return code, "\n".join(out), "\n".join(err)


async def _cli_run(argv: list[str]) -> tuple[int, list[str], list[str]]:
    """`mcp-sidecar ARGV` to its end: the exit code and the lines it printed on stdout and on stderr."""
    async with cli(*argv, env=child_env(), exit_timeout_s=30) as run:
        code = await run.exit_code()
    return code, run.lines["stdout"], run.lines["stderr"]


async def test_mcp_sidecar_hint_reaches_a_listener_and_a_token_rotated_by_sighup_replaces_the_old(
    tmp_path: Path, shop: Upstream, token_file: Path, http: aiohttp.ClientSession
) -> None:
    config = sidecar_config(shop.url, free_port(), polling=TEN_MINUTES, hints={"token_file": str(token_file)})
    replica = Replica("sidecar", tmp_path / "sidecar", config)
    async with replica.service.serving(replica.is_ready):
        stream = await ListenStream.connect(http, replica.url, "p-1", [PRICE])
        try:
            await shop.set_price(190)
            code, out, err = await _cli_hint(replica.admin_port, token_file, PRICE)
            assert (code, out.strip(), err) == (0, "hinted 1 watch, warm for 3 s", "")
            await stream.wait_update(PRICE, HINT_WAIT_S)

            old = _written(tmp_path / "old-token", TOKEN)
            _written(token_file, "rotated-token\n")
            await replica.service.signal(signal.SIGHUP)

            async def old_refused() -> bool:
                async with http.post(
                    f"http://127.0.0.1:{replica.admin_port}/hints",
                    json={"uris": [PRICE]},
                    headers={"Authorization": f"Bearer {TOKEN}"},
                ) as resp:
                    return resp.status == 401

            await eventually(old_refused, within_s=HINT_WAIT_S)
            code, out, err = await _cli_hint(replica.admin_port, old, PRICE)
            assert code == 1 and out == "" and err.startswith("mcp-sidecar hint: 401: ") and "Traceback" not in err
            mark = stream.mark()
            await shop.set_price(191)
            code, out, _ = await _cli_hint(replica.admin_port, token_file, "catalog://*")
            assert (code, out.strip()) == (0, "hinted 1 watch, warm for 3 s")
            await stream.wait_update(PRICE, HINT_WAIT_S, since=mark)
        finally:
            await stream.aclose()


async def test_a_hint_through_one_replica_is_looked_at_by_the_replica_that_polls_the_key(
    tmp_path: Path, shop: Upstream, redis: RedisServer, token_file: Path, http: aiohttp.ClientSession
) -> None:
    hints = {"token_file": str(token_file)}
    async with sidecar_replicas(tmp_path, shop.url, redis.url, 2, polling=TEN_MINUTES, hints=hints) as (one, other):
        stream = await ListenStream.connect(http, other.url, "r-1", [PRICE])  # only `other` watches it
        try:
            # `other` takes the key's polling, and looks once as it does (its first read was the other look):
            # only after that look does the change below need the hint to be seen.
            await eventually(lambda: _leases_of(other, 1), within_s=HINT_WAIT_S)
            await eventually(lambda: _reads_over(shop, PRICE, 1), within_s=HINT_WAIT_S)
            await shop.set_price(200)
            async with http.post(
                f"http://127.0.0.1:{one.admin_port}/hints",
                json={"uris": ["catalog://pr*"]},
                headers={"Authorization": f"Bearer {TOKEN}"},
            ) as resp:
                # `one` holds no watch of it
                assert (resp.status, await resp.json()) == (202, {"hinted": 0, "warm_ms": 3000})
            await stream.wait_update(PRICE, HINT_WAIT_S)
            assert (await other.metrics()).total("mcp_sidecar_watches_hinted_total") == 1
            assert (await one.metrics()).total("mcp_sidecar_hints_received_total", outcome="accepted") == 1
        finally:
            await stream.aclose()


async def test_the_commands_mistakes_are_one_line_each_and_no_traceback(tmp_path: Path, token_file: Path) -> None:
    unreachable = free_port()  # nothing listens there
    cases = [
        (["hint", "--token-file", str(token_file)], 2, "name at least one URI"),
        (["hint", PRICE, "--token-file", str(token_file), "--admin-url", "127.0.0.1:9464"], 2, "--admin-url"),
        (["hint", PRICE, "--token-file", str(tmp_path / "absent")], 1, "--token-file: cannot read"),
        (
            ["hint", PRICE, "--token-file", str(token_file), "--admin-url", f"http://127.0.0.1:{unreachable}"],
            1,
            "cannot reach",
        ),
    ]
    for argv, wanted_code, wanted in cases:
        code, out, lines = await _cli_run(argv)
        err = "\n".join(lines)
        assert code == wanted_code and out == [], (argv, err)
        assert len(lines) == 1 and lines[0].startswith("mcp-sidecar hint: ") and wanted in lines[0], (argv, err)
