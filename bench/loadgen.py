"""The load generator: a separate aiohttp process driven by the bench, one command at a time.

    python -m bench.loadgen      # reads JSON commands on stdin, answers one JSON line each on stdout

Commands (`cmd` field):
- `forward {url, concurrency, duration_s, warmup_s, uri_prefix, uri_count}`: `resources/read` as fast as
  `concurrency` keep-alive connections allow, each request a different URI (so no two identical requests
  are in flight: the sidecar's single-flight cannot merge them); throughput and latency percentiles.
- `forward_stdio {argv, cwd, concurrency, duration_s, warmup_s}`: the same load written straight to the stdin
  of a stdio server it starts (`argv`), answers matched by id: the floor of the stdio scenario.
- `open {group, url, uris, count, concurrency, reread_url?}`: open `count` listen streams on `uris`, each
  waited for until its ack; with `reread_url`, a pool of keep-alive connections for re-reads is warmed up.
- `change {group, trigger, timeout_s, reread}`: time 0 is just before the trigger (an HTTP POST: an
  out-of-band admin change or a `tools/call` through the sidecar); answers when every stream of the group
  has its next `notifications/resources/updated` (and, with `reread`, has re-read the resource once).
- `close {group}`, `quit`.

Times are `time.monotonic()` (CLOCK_MONOTONIC, the same clock in every process on this machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from bench.common import mcp_body, mcp_headers, percentile, raise_fd_limit

__all__ = ["main"]

UPDATED = b"notifications/resources/updated"
ACK = b"notifications/subscriptions/acknowledged"
REREAD_CONNECTIONS = 100
"""Keep-alive connections a group's re-reads share: below the sidecar's accept backlog (128), so the
storm measures the proxy, not SYN retransmits of a connect storm."""
_STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=30)


@dataclass(eq=False)
class Stream:
    response: aiohttp.ClientResponse
    updates: int = 0
    seen_round: int = 0
    ended: bool = False
    task: asyncio.Task[None] | None = None


@dataclass(eq=False)
class Group:
    name: str
    streams: list[Stream] = field(default_factory=list)
    round: int = 0
    active: bool = False
    t0: float = 0.0
    expected: int = 0
    arrivals: list[float] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    reread: bool = False
    reread_url: str | None = None
    reread_uri: str = ""
    reread_http: aiohttp.ClientSession | None = None
    reread_ok: int = 0
    reread_failed: int = 0
    reread_done_at: float = 0.0
    rereads_done: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def on_update(self, stream: Stream, count: int, now: float) -> None:
        stream.updates += count
        if not self.active or stream.seen_round == self.round:
            return
        stream.seen_round = self.round
        self.arrivals.append(now - self.t0)
        if self.reread:
            task = asyncio.get_running_loop().create_task(self._reread())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        if len(self.arrivals) >= self.expected:
            self.arrived.set()

    async def _reread(self) -> None:
        assert self.reread_http is not None and self.reread_url is not None
        ok = await read_once(self.reread_http, self.reread_url, self.reread_uri)
        if ok:
            self.reread_ok += 1
        else:
            self.reread_failed += 1
        if self.reread_ok + self.reread_failed >= self.expected:
            self.reread_done_at = time.monotonic()
            self.rereads_done.set()


async def read_once(http: aiohttp.ClientSession, url: str, uri: str, request_id: int = 1) -> bool:
    params = {"uri": uri}
    try:
        async with http.post(
            url,
            data=orjson.dumps(mcp_body("resources/read", params, request_id)),
            headers=mcp_headers("resources/read", params),
        ) as resp:
            payload = await resp.read()
            return resp.status == 200 and b'"result"' in payload
    except (aiohttp.ClientError, OSError, TimeoutError):
        return False


class Loadgen:
    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False), timeout=_STREAM_TIMEOUT
        )
        self.control = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))

    async def aclose(self) -> None:
        for name in list(self.groups):
            await self.close({"group": name})
        await self.http.close()
        await self.control.close()

    # -- forwarding load ------------------------------------------------------------------------------

    async def forward(self, cmd: dict[str, Any]) -> dict[str, Any]:
        url: str = cmd["url"]
        concurrency = int(cmd["concurrency"])
        warmup_s = float(cmd.get("warmup_s", 0.5))
        duration_s = float(cmd["duration_s"])
        prefix: str = cmd.get("uri_prefix", "bench://items/")
        uri_count = int(cmd.get("uri_count", 100_000))
        counter = itertools.count(1)
        done: list[tuple[float, float]] = []
        """(end, latency) of every successful request that ended after the warm-up."""
        errors = 0
        start = time.perf_counter()
        measure_from = start + warmup_s
        deadline = measure_from + duration_s
        # A very slow target gets more time (up to 4x) until it has answered a few rounds of `concurrency`.
        min_requests = 2 * concurrency
        hard_stop = measure_from + 4 * duration_s
        connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)

        def keep_going(now: float) -> bool:
            return now < deadline or (len(done) < min_requests and now < hard_stop)

        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as http:

            async def worker() -> None:
                nonlocal errors
                while True:
                    i = next(counter)
                    params = {"uri": f"{prefix}{i % uri_count}"}
                    body = orjson.dumps(mcp_body("resources/read", params, i))
                    began = time.perf_counter()
                    if not keep_going(began):
                        return
                    try:
                        async with http.post(url, data=body, headers=mcp_headers("resources/read", params)) as resp:
                            payload = await resp.read()
                            ok = resp.status == 200 and b'"result"' in payload
                    except (aiohttp.ClientError, OSError, TimeoutError):
                        ok = False
                    ended = time.perf_counter()
                    if ended >= measure_from:
                        if ok:
                            done.append((ended, ended - began))
                        else:
                            errors += 1

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        return _summary(done, errors, measure_from, deadline, min_requests)

    async def forward_stdio(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """`forward`'s floor for a stdio server: `resources/read` written straight to its stdin, no proxy."""
        concurrency = int(cmd["concurrency"])
        warmup_s = float(cmd.get("warmup_s", 0.5))
        duration_s = float(cmd["duration_s"])
        proc = await asyncio.create_subprocess_exec(
            *cmd["argv"], cwd=cmd.get("cwd"), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, limit=2**24,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout
        waiting: dict[int, asyncio.Future[bytes]] = {}

        async def read_answers() -> None:
            while line := await stdout.readline():
                answer = waiting.pop(orjson.loads(line).get("id"), None)
                if answer is not None and not answer.done():
                    answer.set_result(line)

        async def call(request_id: int, method: str, params: dict[str, Any]) -> bool:
            answer = asyncio.get_running_loop().create_future()
            waiting[request_id] = answer
            stdin.write(orjson.dumps(mcp_body(method, params, request_id)) + b"\n")
            await stdin.drain()
            return b'"result"' in await asyncio.wait_for(answer, 30)

        reader = asyncio.get_running_loop().create_task(read_answers())
        counter = itertools.count(1)
        done: list[tuple[float, float]] = []
        errors = 0
        try:
            await call(0, "server/discover", {})
            start = time.perf_counter()
            measure_from = start + warmup_s
            deadline = measure_from + duration_s

            async def worker() -> None:
                nonlocal errors
                while (began := time.perf_counter()) < deadline:
                    i = next(counter)
                    try:
                        ok = await call(i, "resources/read", {"uri": f"bench://items/{i}"})
                    except TimeoutError:
                        ok = False
                    ended = time.perf_counter()
                    if ended >= measure_from:
                        if ok:
                            done.append((ended, ended - began))
                        else:
                            errors += 1

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        finally:
            stdin.close()
            reader.cancel()
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        return _summary(done, errors, measure_from, deadline, 2 * concurrency)

    # -- listen streams ---------------------------------------------------------------------------------

    async def open(self, cmd: dict[str, Any]) -> dict[str, Any]:
        name: str = cmd["group"]
        group = self.groups.setdefault(name, Group(name))
        url: str = cmd["url"]
        uris: list[str] = list(cmd["uris"])
        count = int(cmd["count"])
        semaphore = asyncio.Semaphore(int(cmd.get("concurrency", 64)))
        refused: list[str] = []
        started = time.monotonic()

        async def open_one(index: int) -> None:
            async with semaphore:
                params = {"notifications": {"resourceSubscriptions": uris}}
                body = orjson.dumps(mcp_body("subscriptions/listen", params, f"{name}-{before + index}"))
                try:
                    response = await self.http.post(url, data=body, headers=mcp_headers("subscriptions/listen"))
                except (aiohttp.ClientError, OSError) as exc:
                    refused.append(f"connect: {exc!r}")
                    return
                if response.status != 200:
                    refused.append(f"{response.status}: {(await response.text())[:200]}")
                    response.release()
                    return
                buffer = b""
                try:
                    while b"\n\n" not in buffer.replace(b"\r\n", b"\n"):
                        chunk = await asyncio.wait_for(response.content.readany(), 60)
                        if not chunk:
                            break
                        buffer += chunk
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    refused.append(f"no ack: {exc!r}")
                    response.close()
                    return
                honoured = _ack_uris(buffer)
                if honoured is None or len(honoured) != len(uris):
                    refused.append(f"ack without every URI: {buffer[:300]!r}")
                    response.close()
                    return
                stream = Stream(response)
                group.streams.append(stream)
                stream.task = asyncio.get_running_loop().create_task(self._read(group, stream, buffer))

        before = len(group.streams)
        await asyncio.gather(*(open_one(i) for i in range(count)))
        opened_s = time.monotonic() - started
        reread_url = cmd.get("reread_url")
        if reread_url:
            group.reread_url = reread_url
            group.reread_uri = uris[0]
            if group.reread_http is None:
                group.reread_http = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=REREAD_CONNECTIONS), timeout=aiohttp.ClientTimeout(total=60)
                )
            http = group.reread_http
            # Fill the pool: afterwards a storm reuses warm keep-alive connections.
            await asyncio.gather(*(read_once(http, reread_url, uris[0], i) for i in range(2 * REREAD_CONNECTIONS)))
        return {
            "opened": len(group.streams) - before,
            "total": len(group.streams),
            "refused": len(refused),
            "reasons": refused[:3],
            "seconds": opened_s,
        }

    async def _read(self, group: Group, stream: Stream, first: bytes) -> None:
        ack_end = first.find(ACK)
        tail = first[ack_end + len(ACK) :] if ack_end >= 0 else b""
        keep = len(UPDATED) - 1
        try:
            pending = tail.count(UPDATED)
            if pending:
                group.on_update(stream, pending, time.monotonic())
            tail = tail[-keep:]
            async for chunk in stream.response.content.iter_any():
                data = tail + chunk
                found = data.count(UPDATED)
                if found:
                    group.on_update(stream, found, time.monotonic())
                tail = data[-keep:]
        except (aiohttp.ClientError, OSError, asyncio.CancelledError):
            pass
        finally:
            stream.ended = True

    async def change(self, cmd: dict[str, Any]) -> dict[str, Any]:
        group = self.groups[cmd["group"]]
        trigger: dict[str, Any] = cmd["trigger"]
        timeout_s = float(cmd.get("timeout_s", 10))
        live = [s for s in group.streams if not s.ended]
        group.round += 1
        group.arrivals = []
        group.expected = len(live)
        group.arrived.clear()
        group.reread = bool(cmd.get("reread")) and group.reread_url is not None
        group.reread_ok = group.reread_failed = 0
        group.rereads_done.clear()
        group.t0 = time.monotonic()
        group.active = True
        try:
            async with self.control.post(
                trigger["url"], data=orjson.dumps(trigger["body"]), headers=trigger.get("headers") or {}
            ) as resp:
                await resp.read()
                trigger_status = resp.status
            trigger_s = time.monotonic() - group.t0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(group.arrived.wait(), timeout_s)
            if group.reread:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(group.rereads_done.wait(), timeout_s)
        finally:
            group.active = False
        arrivals = sorted(group.arrivals)
        return {
            "t0": group.t0,
            "trigger_status": trigger_status,
            "trigger_s": trigger_s,
            "latencies": arrivals,
            "expected": group.expected,
            "missing": group.expected - len(arrivals),
            "first_at": group.t0 + arrivals[0] if arrivals else None,
            "reread_ok": group.reread_ok,
            "reread_failed": group.reread_failed,
            "reread_done_at": group.reread_done_at if group.reread else None,
        }

    async def close(self, cmd: dict[str, Any]) -> dict[str, Any]:
        group = self.groups.pop(cmd["group"], None)
        if group is None:
            return {"closed": 0}
        for stream in group.streams:
            stream.response.close()
            if stream.task is not None:
                stream.task.cancel()
        tasks = [s.task for s in group.streams if s.task is not None]
        await asyncio.gather(*tasks, *group.tasks, return_exceptions=True)
        if group.reread_http is not None:
            await group.reread_http.close()
        return {"closed": len(group.streams)}


def _summary(
    done: list[tuple[float, float]], errors: int, measure_from: float, deadline: float, min_requests: int
) -> dict[str, Any]:
    """Throughput and latency percentiles of the answers (end, latency) that ended inside the window."""
    in_window = [latency for end, latency in done if end <= deadline]
    window_end = deadline
    if len(in_window) < min_requests and done:
        in_window = [latency for _, latency in done]
        window_end = max(deadline, max(end for end, _ in done))
    seconds = window_end - measure_from
    return {
        "requests": len(in_window),
        "errors": errors,
        "seconds": seconds,
        "rps": len(in_window) / seconds,
        "p50_ms": percentile(in_window, 0.50) * 1000,
        "p90_ms": percentile(in_window, 0.90) * 1000,
        "p99_ms": percentile(in_window, 0.99) * 1000,
        "mean_ms": (sum(in_window) / len(in_window) * 1000) if in_window else float("nan"),
    }


def _ack_uris(buffer: bytes) -> list[str] | None:
    """The URIs the ack (the first SSE event) honours; None when the first event is not an ack."""
    event = buffer.replace(b"\r\n", b"\n").split(b"\n\n", 1)[0]
    data = b"\n".join(line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:"))
    try:
        frame = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(frame, dict) or frame.get("method") != ACK.decode():
        return None
    uris = frame["params"]["notifications"].get("resourceSubscriptions", [])
    return list(uris) if isinstance(uris, list) else None


async def _serve() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    loadgen = Loadgen()
    handlers = {
        "forward": loadgen.forward,
        "forward_stdio": loadgen.forward_stdio,
        "open": loadgen.open,
        "change": loadgen.change,
        "close": loadgen.close,
    }
    try:
        while True:
            line = await reader.readline()
            if not line:
                return
            cmd = orjson.loads(line)
            if cmd.get("cmd") == "quit":
                return
            try:
                answer = await handlers[cmd["cmd"]](cmd)
            except Exception as exc:  # reported to the bench, which fails the scenario with it
                answer = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            sys.stdout.buffer.write(orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
            sys.stdout.buffer.flush()
    finally:
        await loadgen.aclose()


def main() -> None:
    raise_fd_limit()
    asyncio.run(_serve())


if __name__ == "__main__":
    main()
