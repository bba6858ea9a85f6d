"""A fault-injecting MCP upstream on a raw asyncio socket server, for faults a real server cannot produce.

It runs in the test's own event loop (no subprocess), so a test reads its request log and in-flight
counts directly. Healthy, it is a minimal MCP server of either era:

- ``modern``: ``server/discover``, ``resources/read``, ``resources/list``, ``tools/list``, ``tools/call``
  (2026-07-28, JSON or SSE answers); a read of ``private://...`` is ``cacheScope: private`` and its
  text names the caller's token, anything else is public.
- ``legacy``: ``server/discover`` is refused with 400 -32600 (as an SDK 1.x server would), and the same
  methods are served on sessions opened by ``initialize`` (``Mcp-Session-Id``; unknown session: 404).

A :class:`Rule` makes matching requests fail with one :class:`Fault`, at the socket level where that is
the point: a reset mid-body (RST after part of the promised Content-Length), a hang, an HTML 500/502, a
non-JSON 200, an SSE stream cut in the middle of an event, an answer larger than the sidecar accepts, or
a 404 on every session request (the re-initialize storm). "Connection refused" is :meth:`stop` (then
:meth:`start` listens on the same port again).

    async with FaultyUpstream() as up:
        up.fail(Fault.HANG, uri="hang://x")
        ...  # point the sidecar at up.url; up.requests, up.max_inflight, ...
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import json
import socket
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

__all__ = ["Fault", "FaultyUpstream", "Rule", "Seen"]

Era = Literal["modern", "legacy"]

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
HTML_BODY = (
    b"<html><body><h1>Internal Server Error</h1><pre>Traceback (most recent call last):\n"
    b'  File "/srv/app/secret_internals.py", line 42, in handler\n'
    b"    db.connect(password='hunter2')\nConnectionError: database on 10.0.0.7 is down</pre></body></html>"
)
"""What an HTML error page of a crashing upstream shows: none of it may reach a client."""


class Fault(enum.Enum):
    RESET_MID_BODY = "reset-mid-body"
    """Headers promising 4096 bytes of JSON, 100 of them, then a TCP reset."""
    HANG = "hang"
    """The request is read and never answered (until the upstream stops)."""
    HTML_500 = "html-500"
    HTML_502 = "html-502"
    NOT_JSON = "not-json"
    """200 with ``Content-Type: application/json`` and an HTML body."""
    TRUNCATED_SSE = "truncated-sse"
    """200 ``text/event-stream`` (chunked): a progress event, half of the next event, then the connection closes."""
    OVERSIZED_JSON = "oversized-json"
    """200 with a well-formed JSON-RPC answer of ``oversize_bytes``, chunked (no Content-Length to refuse early)."""
    OVERSIZED_SSE = "oversized-sse"
    """The same answer as one SSE event."""
    DRIP = "drip"
    """200 with a whole, valid answer's Content-Length, its body sent one byte every 0.1 s (a slow-loris upstream)."""
    CLOSED_WHEN_REUSED = "closed-when-reused"
    """On a connection that already served a request: read the request, close without a byte (a server's idle
    timeout crossing the next request on a kept-alive connection). The first request on a connection is served."""
    SESSION_404 = "session-404"
    """Legacy era: every request on a session is answered 404, as if the upstream forgot the session at once."""


@dataclass(frozen=True)
class Rule:
    """Which requests a fault hits: all of `methods` (default: reads) whose URI and token match, when given."""

    fault: Fault
    uri: str | None = None
    token: str | None = None
    methods: frozenset[str] | None = frozenset({"resources/read"})

    def matches(self, method: str | None, uri: str | None, token: str | None) -> bool:
        return (
            (self.methods is None or method in self.methods)
            and (self.uri is None or uri == self.uri)
            and (self.token is None or token == self.token)
        )


@dataclass
class Seen:
    """One JSON-RPC message that reached the upstream."""

    method: str | None
    id: Any
    uri: str | None
    authorization: str | None
    session: str | None
    arrived: float
    """Loop time when the whole request had arrived."""
    fault: Fault | None = None
    done: float | None = None
    """Loop time when the answer was written (None: never answered)."""

    @property
    def by_sidecar(self) -> bool:
        """A request the sidecar made on its own (poll, baseline, probe): its ids are ``sidecar-N``."""
        return isinstance(self.id, str) and self.id.startswith("sidecar-")


@dataclass
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class _Closed(Exception):
    """The fault ended the connection on purpose."""


@dataclass
class FaultyUpstream:
    era: Era = "modern"
    ttl_ms: int = 1000
    oversize_bytes: int = 64 * 1024
    rules: list[Rule] = field(default_factory=list)
    requests: list[Seen] = field(default_factory=list)
    contents: dict[str, str] = field(default_factory=dict)
    """Text of a resource by URI (default: ``content of <uri>``)."""
    delays: dict[str, float] = field(default_factory=dict)
    """Seconds a read of that URI takes."""
    read_delay_s: float = 0.0
    """Seconds every other read takes."""
    sse: bool = False
    """Answer every request as an SSE stream instead of one JSON body."""
    port: int = 0
    inflight: Counter[str] = field(default_factory=Counter)
    """Reads being answered right now, by URI."""
    max_inflight_total: int = 0
    max_inflight_per_uri: int = 0

    def __post_init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._release = asyncio.Event()
        self._handlers: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._sessions: dict[str, str | None] = {}
        self._session_ids = itertools.count(1)

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        self._release = asyncio.Event()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop accepting and end every connection, hung and slow ones included."""
        self._release.set()
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> FaultyUpstream:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    # -- steering and observing --------------------------------------------------------------------

    def fail(self, fault: Fault, **match: Any) -> Rule:
        """Make matching requests fail with `fault` from now on; returns the rule (for :meth:`heal`)."""
        rule = Rule(fault, **match)
        self.rules.append(rule)
        return rule

    def heal(self, rule: Rule | None = None) -> None:
        """Remove one rule, or all of them."""
        if rule is None:
            self.rules.clear()
        else:
            self.rules.remove(rule)

    def seen(self, predicate: Callable[[Seen], bool] = lambda _: True, since: float = 0.0) -> list[Seen]:
        return [entry for entry in self.requests if entry.arrived >= since and predicate(entry)]

    def reads(self, uri: str | None = None, since: float = 0.0) -> list[Seen]:
        return self.seen(lambda e: e.method == "resources/read" and (uri is None or e.uri == uri), since)

    @property
    def connections(self) -> int:
        """Connections open to this upstream (a task each, in the test's loop)."""
        return len(self._handlers)

    @property
    def inflight_total(self) -> int:
        return sum(self.inflight.values())

    # -- HTTP --------------------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        try:
            for served in itertools.count():
                request = await _read_request(reader)
                if request is None:
                    return
                await self._serve(request, writer, reused=served > 0)
        except (_Closed, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._handlers.discard(task)
            self._writers.discard(writer)
            writer.transport.abort()

    async def _serve(self, request: _Request, writer: asyncio.StreamWriter, *, reused: bool) -> None:
        if request.method != "POST" or request.path.rstrip("/") != "/mcp":
            await _write(writer, 405, {"Allow": "POST"}, b"")
            return
        try:
            message = json.loads(request.body)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            await _write(writer, 400, {"Content-Type": "application/json"}, b'{"error": "not a JSON object"}')
            return
        params = message.get("params") if isinstance(message.get("params"), dict) else {}
        uri = params.get("uri") if isinstance(params.get("uri"), str) else None
        authorization = request.headers.get("authorization")
        token = authorization.removeprefix("Bearer ").strip() if authorization else None
        method = message.get("method") if isinstance(message.get("method"), str) else None
        loop = asyncio.get_running_loop()
        seen = Seen(method, message.get("id"), uri, authorization, request.headers.get("mcp-session-id"), loop.time())
        self.requests.append(seen)
        rule = next((rule for rule in self.rules if rule.matches(method, uri, token)), None)
        if rule is not None and rule.fault is Fault.CLOSED_WHEN_REUSED and not reused:
            rule = None
        if rule is not None and not (rule.fault is Fault.SESSION_404 and method == "initialize"):
            seen.fault = rule.fault
            await self._inject(rule.fault, message, writer)
            seen.done = loop.time()
            return
        if "id" not in message:
            await _write(writer, 202, {}, b"")
            seen.done = loop.time()
            return
        status, extra, answer = await self._answer(message, method, params, uri, token, request.headers)
        await self._reply(writer, status, extra, answer)
        seen.done = loop.time()

    async def _answer(
        self,
        message: dict[str, Any],
        method: str | None,
        params: dict[str, Any],
        uri: str | None,
        token: str | None,
        headers: dict[str, str],
    ) -> tuple[int, dict[str, str], dict[str, Any]]:
        request_id = message.get("id")
        extra: dict[str, str] = {}
        if self.era == "legacy":
            if method == "initialize":
                session = f"s-{next(self._session_ids)}"
                self._sessions[session] = token
                extra["Mcp-Session-Id"] = session
                result = {
                    "protocolVersion": LEGACY,
                    "capabilities": {"resources": {}, "tools": {}},
                    "serverInfo": {"name": "faulty", "version": "0"},
                }
                return 200, extra, _result(request_id, result)
            if method == "server/discover" or headers.get("mcp-protocol-version") not in (None, LEGACY):
                return 400, extra, _error(None, -32600, "Bad Request: Unsupported protocol version")
            session = headers.get("mcp-session-id")
            if session is None or session not in self._sessions:
                return 404, extra, _error(request_id, -32600, "Session not found")
        result = await self._result(method, params, uri, token)
        if result is None:
            return 200, extra, _error(request_id, -32601, "Method not found")
        if self.era == "modern":
            result.setdefault("resultType", "complete")
        return 200, extra, _result(request_id, result)

    async def _result(
        self, method: str | None, params: dict[str, Any], uri: str | None, token: str | None
    ) -> dict[str, Any] | None:
        modern = self.era == "modern"
        if method == "server/discover" and modern:
            return {
                "supportedVersions": [MODERN],
                "capabilities": {"resources": {}, "tools": {}},
                "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "faulty", "version": "0"}},
            }
        if method == "resources/read" and uri is not None:
            await self._read_delay(uri)
            text = self.contents.get(uri, f"content of {uri}")
            private = uri.startswith("private:")
            if private:
                text = f"{text} for {token}"
            result: dict[str, Any] = {"contents": [{"uri": uri, "mimeType": "text/plain", "text": text}]}
            if modern:
                result.update(ttlMs=self.ttl_ms, cacheScope="private" if private else "public")
            return result
        if method == "resources/list":
            return {"resources": [{"uri": uri, "name": uri} for uri in sorted(self.contents)]}
        if method == "tools/list":
            return {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}
        if method == "tools/call":
            arguments = params.get("arguments") if isinstance(params.get("arguments"), dict) else {}
            return {"content": [{"type": "text", "text": str(arguments.get("text", ""))}]}
        return None

    async def _read_delay(self, uri: str) -> None:
        self.inflight[uri] += 1
        self.max_inflight_per_uri = max(self.max_inflight_per_uri, self.inflight[uri])
        self.max_inflight_total = max(self.max_inflight_total, self.inflight_total)
        try:
            await self._pause(self.delays.get(uri, self.read_delay_s))
        finally:
            self.inflight[uri] -= 1
            if not self.inflight[uri]:
                del self.inflight[uri]

    async def _pause(self, seconds: float | None) -> None:
        """Wait `seconds` (None: forever); when the upstream stops meanwhile, end the connection."""
        if seconds is not None and seconds <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._release.wait()
                raise _Closed

    async def _reply(self, writer: asyncio.StreamWriter, status: int, extra: dict[str, str], answer: Any) -> None:
        body = json.dumps(answer).encode()
        if self.sse and status == 200:
            event = b"event: message\r\ndata: " + body + b"\r\n\r\n"
            await _write(writer, 200, {**extra, "Content-Type": "text/event-stream"}, event)
        else:
            await _write(writer, status, {**extra, "Content-Type": "application/json"}, body)

    async def _inject(self, fault: Fault, message: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        request_id = message.get("id")
        if fault is Fault.RESET_MID_BODY:
            writer.write(_head(200, {"Content-Type": "application/json", "Content-Length": "4096"}))
            partial = b'{"jsonrpc": "2.0", "id": ' + json.dumps(request_id).encode() + b', "result": {"con'
            writer.write(partial + b" " * 60)
            await writer.drain()
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
            raise _Closed
        if fault is Fault.CLOSED_WHEN_REUSED:
            raise _Closed
        if fault is Fault.HANG:
            await self._pause(None)
        if fault in (Fault.HTML_500, Fault.HTML_502):
            status = 500 if fault is Fault.HTML_500 else 502
            await _write(writer, status, {"Content-Type": "text/html", "X-Backend": "app-7.internal"}, HTML_BODY)
            return
        if fault is Fault.NOT_JSON:
            await _write(writer, 200, {"Content-Type": "application/json"}, HTML_BODY)
            return
        if fault is Fault.TRUNCATED_SSE:
            writer.write(_head(200, {"Content-Type": "text/event-stream", "Transfer-Encoding": "chunked"}))
            progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
            first = b"event: message\r\ndata: " + json.dumps(progress).encode() + b"\r\n\r\n"
            half = b'event: message\r\ndata: {"jsonrpc": "2.0", "id": ' + json.dumps(request_id).encode() + b', "res'
            for chunk in (first, half):
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
            raise _Closed  # no terminating chunk: the body is cut short
        if fault in (Fault.OVERSIZED_JSON, Fault.OVERSIZED_SSE):
            text = "x" * self.oversize_bytes
            body = json.dumps(_result(request_id, {"contents": [{"uri": "big://", "text": text}]})).encode()
            sse = fault is Fault.OVERSIZED_SSE
            if sse:
                body = b"event: message\r\ndata: " + body + b"\r\n\r\n"
            content_type = "text/event-stream" if sse else "application/json"
            writer.write(_head(200, {"Content-Type": content_type, "Transfer-Encoding": "chunked"}))
            for start in range(0, len(body), 16384):
                chunk = body[start : start + 16384]
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return
        if fault is Fault.SESSION_404:
            await _write(writer, 404, {"Content-Type": "application/json"}, b'{"error": "session not found"}')
            return
        if fault is Fault.DRIP:
            body = json.dumps(_result(request_id, {"contents": [{"uri": "drip://", "text": "slow"}]})).encode()
            writer.write(_head(200, {"Content-Type": "application/json", "Content-Length": str(len(body))}))
            for byte in body:
                writer.write(bytes([byte]))
                await writer.drain()
                await self._pause(0.1)
            return
        raise AssertionError(f"unhandled fault {fault}")


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    line, *lines = head.decode("latin-1").split("\r\n")
    method, path, _ = line.split(" ", 2)
    headers: dict[str, str] = {}
    for header in lines:
        if header:
            name, _, value = header.partition(":")
            headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    else:
        length = int(headers.get("content-length", "0"))
        body = await reader.readexactly(length) if length else b""
    return _Request(method, path, headers, body)


_REASONS = {200: "OK", 202: "Accepted", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
_REASONS.update({500: "Internal Server Error", 502: "Bad Gateway"})


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _write(writer: asyncio.StreamWriter, status: int, headers: dict[str, str], body: bytes) -> None:
    writer.write(_head(status, {**headers, "Content-Length": str(len(body))}) + body)
    with contextlib.suppress(ConnectionError):
        await writer.drain()


def _result(request_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def _error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
