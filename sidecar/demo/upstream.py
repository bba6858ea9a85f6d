"""A tiny 2025-11-25-only MCP server whose plan prices change, used by ``mcp-sidecar demo``.

It speaks only the legacy era (``initialize`` + ``Mcp-Session-Id``) and offers no subscriptions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

__all__ = ["DemoUpstream"]

logger = logging.getLogger(__name__)

DEFAULT_CHANGE_EVERY_S = 3.0
PRICE_STEP = 5
"""How much the ticker adds to the basic plan's price each time."""

_LATEST_VERSION = "2025-11-25"
_LEGACY_VERSIONS = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"})
_SESSION_HEADER = "Mcp-Session-Id"
_VERSION_HEADER = "MCP-Protocol-Version"
_URI_PREFIX = "catalog://plans/"
_PLAN_TITLES = {"basic": "Basic plan", "pro": "Pro plan"}
_INITIAL_PRICES = {"basic": 100, "pro": 250}
# No "subscribe" and no "listChanged": the point of the demo is that the sidecar adds them.
_CAPABILITIES: dict[str, Any] = {"resources": {}, "tools": {}, "prompts": {}, "completions": {}}
_SERVER_INFO = {"name": "demo-catalog", "version": "1.0.0"}

_JsonObj = dict[str, Any]


class _RpcError(Exception):
    """A JSON-RPC error to put in the response body (HTTP 200 unless ``http_status`` says otherwise)."""

    def __init__(self, code: int, message: str, data: Any = None, *, http_status: int = 200) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.http_status = http_status


def _error_response(exc: _RpcError, msg_id: Any) -> web.Response:
    error: _JsonObj = {"code": exc.code, "message": exc.message}
    if exc.data is not None:
        error["data"] = exc.data
    return web.json_response({"jsonrpc": "2.0", "id": msg_id, "error": error}, status=exc.http_status)


def _invalid(message: str) -> _RpcError:
    return _RpcError(-32602, message)


def _object_param(params: _JsonObj, key: str) -> _JsonObj:
    value = params.get(key) or {}
    if not isinstance(value, dict):
        raise _invalid(f"params.{key} must be an object")
    return value


class DemoUpstream:
    """An in-process legacy MCP server on ``POST /mcp`` with a price ticker for the basic plan."""

    def __init__(self, *, change_every_s: float = DEFAULT_CHANGE_EVERY_S) -> None:
        if change_every_s < 0:
            raise ValueError(f"change_every_s must be >= 0 (0 disables the ticker), got {change_every_s}")
        self._change_every_s = change_every_s
        self._prices = dict(_INITIAL_PRICES)
        self._sessions: dict[str, str] = {}  # session id -> negotiated protocol version
        self._runner: web.AppRunner | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._url: str | None = None
        self._methods: dict[str, Callable[[_JsonObj], Awaitable[_JsonObj]]] = {
            "ping": self._ping,
            "resources/list": self._resources_list,
            "resources/templates/list": self._templates_list,
            "resources/read": self._resources_read,
            "tools/list": self._tools_list,
            "tools/call": self._tools_call,
            "prompts/list": self._prompts_list,
            "prompts/get": self._prompts_get,
            "completion/complete": self._complete,
        }

    @property
    def url(self) -> str:
        """The MCP endpoint, e.g. ``http://127.0.0.1:PORT/mcp``; only valid after :meth:`start`."""
        if self._url is None:
            raise RuntimeError("DemoUpstream is not started")
        return self._url

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Bind ``host:port`` (port 0 picks a free one) and start the ticker."""
        if self._runner is not None:
            raise RuntimeError("DemoUpstream is already started")
        app = web.Application()
        app.router.add_post("/mcp", self._handle_post)
        app.router.add_delete("/mcp", self._handle_delete)
        # GET is deliberately unrouted: aiohttp then answers 405, which legacy clients accept.
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        bound_port = runner.addresses[0][1]
        url_host = "127.0.0.1" if host in ("", "0.0.0.0") else host
        self._url = f"http://{url_host}:{bound_port}/mcp"
        if self._change_every_s > 0:
            self._ticker = asyncio.create_task(self._tick(), name="demo-upstream-ticker")
        logger.info("demo upstream: listening on %s", self._url)

    def set_price(self, plan: str, value: int) -> None:
        """Set a plan's price; the next ``resources/read`` shows it. Unknown plans raise ``KeyError``."""
        if plan not in self._prices:
            raise KeyError(f"unknown plan {plan!r}; known: {sorted(self._prices)}")
        self._prices[plan] = value
        logger.info("demo upstream: %s%s price=%d", _URI_PREFIX, plan, value)

    async def aclose(self) -> None:
        """Stop the ticker and the server; safe to call more than once."""
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.cancel()
            try:
                await ticker
            except asyncio.CancelledError:
                # Only the ticker's cancellation is ours to absorb; re-raise if we are cancelled too.
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        self._sessions.clear()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self._change_every_s)
            self.set_price("basic", self._prices["basic"] + PRICE_STEP)

    # -- HTTP ---------------------------------------------------------------------------------------

    async def _handle_post(self, request: web.Request) -> web.Response:
        version = request.headers.get(_VERSION_HEADER)
        if version is not None and version not in _LEGACY_VERSIONS:
            # A modern client probes first; a 400 without a modern error body makes it fall back.
            msg = f"Bad Request: Unsupported protocol version: {version}"
            return _error_response(_RpcError(-32600, msg, http_status=400), None)
        try:
            message = json.loads(await request.read())
        except ValueError:
            return _error_response(_RpcError(-32700, "Parse error", http_status=400), None)
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return _error_response(_RpcError(-32600, "Invalid Request", http_status=400), None)
        msg_id = message.get("id")
        method = message.get("method")
        params = message.get("params") or {}
        if method == "initialize" and "id" in message:
            return self._initialize(msg_id, params)
        session_error = self._check_session(request)
        if session_error is not None:
            return _error_response(session_error, msg_id)
        if method is None and ("result" in message or "error" in message):
            return web.Response(status=202)  # a client's answer to a server request we never send
        if not isinstance(method, str):
            return _error_response(_RpcError(-32600, "Invalid Request", http_status=400), msg_id)
        if "id" not in message:
            return web.Response(status=202)  # every notification, notifications/initialized included
        try:
            if not isinstance(params, dict):
                raise _invalid("params must be an object")
            handler = self._methods.get(method)
            if handler is None:
                raise _RpcError(-32601, "Method not found", {"method": method})
            result = await handler(params)
        except _RpcError as exc:
            return _error_response(exc, msg_id)
        return web.json_response({"jsonrpc": "2.0", "id": msg_id, "result": result})

    async def _handle_delete(self, request: web.Request) -> web.Response:
        session_error = self._check_session(request)
        if session_error is not None:
            return _error_response(session_error, None)
        session_id = request.headers[_SESSION_HEADER]
        del self._sessions[session_id]
        logger.debug("demo upstream: session ended")
        return web.Response(status=200)

    def _check_session(self, request: web.Request) -> _RpcError | None:
        session_id = request.headers.get(_SESSION_HEADER)
        if session_id is None:
            return _RpcError(-32000, "Bad Request: Mcp-Session-Id header is required", http_status=400)
        if session_id not in self._sessions:
            return _RpcError(-32001, "Session not found", http_status=404)
        return None

    def _initialize(self, msg_id: Any, params: Any) -> web.Response:
        requested = params.get("protocolVersion") if isinstance(params, dict) else None
        version = requested if requested in _LEGACY_VERSIONS else _LATEST_VERSION
        session_id = secrets.token_hex(16)
        self._sessions[session_id] = version
        logger.debug("demo upstream: session started, protocolVersion=%s", version)
        result = {"protocolVersion": version, "capabilities": _CAPABILITIES, "serverInfo": _SERVER_INFO}
        body = {"jsonrpc": "2.0", "id": msg_id, "result": result}
        return web.json_response(body, headers={_SESSION_HEADER: session_id})

    # -- MCP methods --------------------------------------------------------------------------------

    async def _ping(self, params: _JsonObj) -> _JsonObj:
        return {}

    async def _resources_list(self, params: _JsonObj) -> _JsonObj:
        resources = [
            {"uri": f"{_URI_PREFIX}{plan}", "name": title, "mimeType": "text/plain"}
            for plan, title in _PLAN_TITLES.items()
        ]
        return {"resources": resources}

    async def _templates_list(self, params: _JsonObj) -> _JsonObj:
        template = {"uriTemplate": _URI_PREFIX + "{plan}", "name": "Plan", "mimeType": "text/plain"}
        return {"resourceTemplates": [template]}

    async def _resources_read(self, params: _JsonObj) -> _JsonObj:
        uri = params.get("uri")
        if not isinstance(uri, str):
            raise _invalid("params.uri must be a string")
        plan = uri.removeprefix(_URI_PREFIX) if uri.startswith(_URI_PREFIX) else None
        if plan not in self._prices:
            # -32002 is the 2025-11-25 code; the sidecar maps it to -32602 for modern clients.
            raise _RpcError(-32002, "Resource not found", {"uri": uri})
        text = f"price={self._prices[plan]}"
        return {"contents": [{"uri": uri, "mimeType": "text/plain", "text": text}]}

    async def _tools_list(self, params: _JsonObj) -> _JsonObj:
        schema = {
            "type": "object",
            "properties": {
                "plan": {"type": "string", "description": "Plan name, e.g. basic"},
                "seats": {"type": "integer", "minimum": 1},
            },
            "required": ["plan", "seats"],
        }
        tool = {"name": "quote", "description": "Price a plan for a number of seats.", "inputSchema": schema}
        return {"tools": [tool]}

    async def _tools_call(self, params: _JsonObj) -> _JsonObj:
        if params.get("name") != "quote":
            raise _invalid(f"Unknown tool: {params.get('name')}")
        args = _object_param(params, "arguments")
        plan, seats = args.get("plan"), args.get("seats")
        # 2025-11-25 reports bad tool input as a tool result with isError, not as a JSON-RPC error.
        if plan not in self._prices or not isinstance(seats, int) or isinstance(seats, bool) or seats < 1:
            text = f"invalid arguments: plan must be one of {sorted(self._prices)}, seats an integer >= 1"
            return {"content": [{"type": "text", "text": text}], "isError": True}
        text = f"{plan} x {seats} seats = {self._prices[plan] * seats}"
        return {"content": [{"type": "text", "text": text}], "isError": False}

    async def _prompts_list(self, params: _JsonObj) -> _JsonObj:
        argument = {"name": "plan", "description": "Plan to focus on", "required": False}
        prompt = {"name": "compare_plans", "description": "Compare the plans.", "arguments": [argument]}
        return {"prompts": [prompt]}

    async def _prompts_get(self, params: _JsonObj) -> _JsonObj:
        if params.get("name") != "compare_plans":
            raise _invalid(f"Unknown prompt: {params.get('name')}")
        focus = _object_param(params, "arguments").get("plan")
        listing = ", ".join(f"{plan} (price={price})" for plan, price in self._prices.items())
        text = f"Compare these plans: {listing}." + (f" Focus on {focus}." if focus else "")
        message = {"role": "user", "content": {"type": "text", "text": text}}
        return {"description": "Compare the plans.", "messages": [message]}

    async def _complete(self, params: _JsonObj) -> _JsonObj:
        argument = _object_param(params, "argument")
        values: list[str] = []
        if argument.get("name") == "plan":
            prefix = str(argument.get("value") or "")
            values = [plan for plan in self._prices if plan.startswith(prefix)]
        return {"completion": {"values": values, "total": len(values), "hasMore": False}}
