"""A fault-injecting MCP upstream on a raw asyncio socket server, for faults a real server cannot produce.

It runs in the test's own event loop (no subprocess), so a test reads its request log and in-flight
counts directly. Healthy, it is a minimal MCP server of either era:

- ``modern``: ``server/discover``, ``resources/read``, ``resources/list``, ``tools/list``, ``tools/call``
  (2026-07-28, JSON or SSE answers); a read of ``private://...`` is ``cacheScope: private`` and its
  text names the caller's token, anything else is public.
- ``legacy``: ``server/discover`` is refused with 400 -32600 (as an SDK 1.x server would), and the same
  methods are served on sessions opened by ``initialize`` (``Mcp-Session-Id``; unknown session: 404, or what
  ``lost_session`` says, as server-everything's 400 "Bad Request: No valid session ID provided").
  :meth:`forget_sessions` forgets every session opened so far, as a restarted server has.

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
import itertools
import json
import socket
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from tests.peers.faults import HTML_BODY, Fault, Rule, Seen
from tests.peers.raw_http import (
    Closed,
    RawRequest,
    error_message,
    read_request,
    response_head,
    result_message,
    write_response,
)

__all__ = ["Fault", "FaultyUpstream", "Rule", "Seen"]

Era = Literal["modern", "legacy"]

MODERN = "2026-07-28"
LEGACY = "2025-11-25"


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
    lost_session: tuple[int, str] = (404, "Session not found")
    """Legacy era: the status and JSON-RPC error message a request on a session it does not know gets."""

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

    def forget_sessions(self) -> None:
        """Forget every session opened so far (a restarted server knows none of them)."""
        self._sessions.clear()

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
                request = await read_request(reader)
                if request is None:
                    return
                await self._serve(request, writer, reused=served > 0)
        except (Closed, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._handlers.discard(task)
            self._writers.discard(writer)
            writer.transport.abort()

    async def _serve(self, request: RawRequest, writer: asyncio.StreamWriter, *, reused: bool) -> None:
        if request.method != "POST" or request.path.rstrip("/") != "/mcp":
            await write_response(writer, 405, {"Allow": "POST"}, b"")
            return
        try:
            message = json.loads(request.body)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            await write_response(writer, 400, {"Content-Type": "application/json"}, b'{"error": "not a JSON object"}')
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
            await write_response(writer, 202, {}, b"")
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
                return 200, extra, result_message(request_id, result)
            if method == "server/discover" or headers.get("mcp-protocol-version") not in (None, LEGACY):
                return 400, extra, error_message(None, -32600, "Bad Request: Unsupported protocol version")
            session = headers.get("mcp-session-id")
            if session is None or session not in self._sessions:
                status, text = self.lost_session
                if status == 404:
                    return status, extra, error_message(request_id, -32600, text)
                return status, extra, error_message(None, -32000, text)  # as server-everything answers it
        result = await self._result(method, params, uri, token)
        if result is None:
            return 200, extra, error_message(request_id, -32601, "Method not found")
        if self.era == "modern":
            result.setdefault("resultType", "complete")
        return 200, extra, result_message(request_id, result)

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
                raise Closed

    async def _reply(self, writer: asyncio.StreamWriter, status: int, extra: dict[str, str], answer: Any) -> None:
        body = json.dumps(answer).encode()
        if self.sse and status == 200:
            event = b"event: message\r\ndata: " + body + b"\r\n\r\n"
            await write_response(writer, 200, {**extra, "Content-Type": "text/event-stream"}, event)
        else:
            await write_response(writer, status, {**extra, "Content-Type": "application/json"}, body)

    async def _inject(self, fault: Fault, message: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        request_id = message.get("id")
        if fault is Fault.RESET_MID_BODY:
            writer.write(response_head(200, {"Content-Type": "application/json", "Content-Length": "4096"}))
            partial = b'{"jsonrpc": "2.0", "id": ' + json.dumps(request_id).encode() + b', "result": {"con'
            writer.write(partial + b" " * 60)
            await writer.drain()
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
            raise Closed
        if fault is Fault.CLOSED_WHEN_REUSED:
            raise Closed
        if fault is Fault.HANG:
            await self._pause(None)
        if fault in (Fault.HTML_500, Fault.HTML_502):
            status = 500 if fault is Fault.HTML_500 else 502
            await write_response(
                writer, status, {"Content-Type": "text/html", "X-Backend": "app-7.internal"}, HTML_BODY
            )
            return
        if fault is Fault.NOT_JSON:
            await write_response(writer, 200, {"Content-Type": "application/json"}, HTML_BODY)
            return
        if fault is Fault.TRUNCATED_SSE:
            writer.write(response_head(200, {"Content-Type": "text/event-stream", "Transfer-Encoding": "chunked"}))
            progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
            first = b"event: message\r\ndata: " + json.dumps(progress).encode() + b"\r\n\r\n"
            half = b'event: message\r\ndata: {"jsonrpc": "2.0", "id": ' + json.dumps(request_id).encode() + b', "res'
            for chunk in (first, half):
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
            raise Closed  # no terminating chunk: the body is cut short
        if fault in (Fault.OVERSIZED_JSON, Fault.OVERSIZED_SSE):
            text = "x" * self.oversize_bytes
            body = json.dumps(result_message(request_id, {"contents": [{"uri": "big://", "text": text}]})).encode()
            sse = fault is Fault.OVERSIZED_SSE
            if sse:
                body = b"event: message\r\ndata: " + body + b"\r\n\r\n"
            content_type = "text/event-stream" if sse else "application/json"
            writer.write(response_head(200, {"Content-Type": content_type, "Transfer-Encoding": "chunked"}))
            for start in range(0, len(body), 16384):
                chunk = body[start : start + 16384]
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return
        if fault is Fault.SESSION_404:
            await write_response(writer, 404, {"Content-Type": "application/json"}, b'{"error": "session not found"}')
            return
        if fault is Fault.DRIP:
            body = json.dumps(result_message(request_id, {"contents": [{"uri": "drip://", "text": "slow"}]})).encode()
            writer.write(response_head(200, {"Content-Type": "application/json", "Content-Length": str(len(body))}))
            for byte in body:
                writer.write(bytes([byte]))
                await writer.drain()
                await self._pause(0.1)
            return
        raise AssertionError(f"unhandled fault {fault}")
