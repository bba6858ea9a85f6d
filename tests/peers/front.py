"""What every peer server puts in front of its SDK app: the admin log of every JSON-RPC message POSTed to
/mcp, the OAuth-protected-resource checks (`--auth`), the once-per-session authentication (`--session-auth`)
and the 2025-11-25-only guard (`legacy`), as one ASGI front with the admin routes beside /mcp."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

import uvicorn
from mcp.server.caching import CacheHint
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "MCP_PATH",
    "PRM_PATH",
    "AdminLog",
    "AuthState",
    "Front",
    "cache_hints",
    "log_routes",
    "peer_parser",
    "serve",
]

MCP_PATH = "/mcp"
PRM_PATH = "/.well-known/oauth-protected-resource"


class AdminLog:
    """Every JSON-RPC message POSTed to /mcp, in arrival order (rejected ones included), with the upstream's own
    times (`time.monotonic()`, one clock for every process of the machine): `at` when it had arrived, `done` when
    its answer's last byte was handed on (None until then), so a test can count reads over the time that passed."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def record(self, message: Any, headers: dict[str, str]) -> dict[str, Any] | None:
        if not isinstance(message, dict):
            return None
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        self.entries.append(
            {
                "at": time.monotonic(),
                "done": None,
                "method": message.get("method"),
                "id": message.get("id"),
                "uri": params.get("uri"),
                "name": params.get("name"),
                "authorization": headers.get("authorization"),
                "session": headers.get("mcp-session-id"),
                "protocol_version": headers.get("mcp-protocol-version"),
                "traceparent": headers.get("traceparent"),
                "meta_traceparent": (params.get("_meta") or {}).get("traceparent"),
            }
        )
        return self.entries[-1]


class AuthState:
    """The tokens an ``--auth`` server accepts, and the metadata it publishes about itself."""

    def __init__(self, port: int) -> None:
        self.base_url = f"http://127.0.0.1:{port}"
        self.granted: set[str] = set()
        self.forbidden: set[str] = set()

    @property
    def metadata_url(self) -> str:
        return f"{self.base_url}{PRM_PATH}{MCP_PATH}"

    def metadata(self) -> dict[str, Any]:
        return {
            "resource": f"{self.base_url}{MCP_PATH}",
            "authorization_servers": [f"{self.base_url}/oauth"],
            "bearer_methods_supported": ["header"],
            "scopes_supported": ["shop"],
        }

    def refusal(self, authorization: str | None) -> Response | None:
        """None for a granted token; otherwise the 401 or 403 an OAuth-protected MCP server answers."""
        token = authorization.removeprefix("Bearer ").strip() if authorization else None
        if token is None or token not in self.granted:
            challenge = f'Bearer resource_metadata="{self.metadata_url}"'
            body = {"error": "invalid_token", "error_description": "missing, unknown or revoked token"}
            return JSONResponse(body, status_code=401, headers={"WWW-Authenticate": challenge})
        if token in self.forbidden:
            challenge = f'Bearer error="insufficient_scope", scope="shop", resource_metadata="{self.metadata_url}"'
            body = {"error": "insufficient_scope", "error_description": "the token lacks the shop scope"}
            return JSONResponse(body, status_code=403, headers={"WWW-Authenticate": challenge})
        return None


class Front:
    """ASGI front: /admin/* to the admin router; /mcp is logged, auth-checked (--auth), era-guarded (legacy),
    then replayed."""

    def __init__(
        self,
        app: ASGIApp,
        admin: ASGIApp,
        log: AdminLog,
        *,
        legacy: bool,
        auth: AuthState | None = None,
        session_auth: bool = False,
    ) -> None:
        self.app = app
        self.admin = admin
        self.log = log
        self.legacy = legacy
        self.auth = auth
        self.session_auth = session_auth
        self.session_owners: dict[str, str] = {}
        """--session-auth: session id -> the Authorization it was opened with."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/admin/"):
            await self.admin(scope, receive, send)
            return
        if self.auth is not None and scope["type"] == "http" and scope["path"] in (PRM_PATH, PRM_PATH + MCP_PATH):
            await JSONResponse(self.auth.metadata())(scope, receive, send)
            return
        if scope["type"] != "http" or scope["path"].rstrip("/") != MCP_PATH:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        body = b""
        if scope["method"] == "POST":
            more = True
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body += message.get("body", b"")
                more = message.get("more_body", False)
            try:
                payload = json.loads(body)
            except ValueError:
                payload = None
            recorded = [
                self.log.record(item, headers) for item in (payload if isinstance(payload, list) else [payload])
            ]
            send = _answered(send, [entry for entry in recorded if entry is not None])
        if self.auth is not None:
            refusal = self.auth.refusal(headers.get("authorization"))
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        if self.session_auth:
            owned = self._session_owner(scope, headers, send)
            if owned is None:
                challenge = {"WWW-Authenticate": "Bearer"}
                await JSONResponse({"error": "invalid_token"}, status_code=401, headers=challenge)(scope, receive, send)
                return
            scope, send = owned
        version = headers.get("mcp-protocol-version")
        if self.legacy and version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            supported = ", ".join(HANDSHAKE_PROTOCOL_VERSIONS)
            error = {
                "jsonrpc": "2.0",
                "id": None,
                "error": {
                    "code": -32600,
                    "message": f"Bad Request: Unsupported protocol version: {version}. Supported versions: {supported}",
                },
            }
            await JSONResponse(error, status_code=400)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _session_owner(self, scope: Scope, headers: dict[str, str], send: Send) -> tuple[Scope, Send] | None:
        """--session-auth: a session is opened with a token (None: refused without one) and is its owner's from
        then on, whatever Authorization later requests carry or lack, as a server that authenticates once."""
        session = headers.get("mcp-session-id")
        if session is None:
            owner = headers.get("authorization")
            if not owner:
                return None

            async def remember(message: Message) -> None:
                if message["type"] == "http.response.start":
                    for name, value in message.get("headers", []):
                        if name.decode("latin-1").lower() == "mcp-session-id":
                            self.session_owners[value.decode("latin-1")] = owner
                await send(message)

            return scope, remember
        owner = self.session_owners.get(session)
        if owner is None:
            return scope, send  # an unknown session: the SDK answers 404
        kept = [(name, value) for name, value in scope["headers"] if name.lower() != b"authorization"]
        return {**scope, "headers": [*kept, (b"authorization", owner.encode("latin-1"))]}, send


def log_routes(log: AdminLog, health: dict[str, Any]) -> list[Route]:
    """The admin routes every peer serves: `GET /admin/log`, `POST /admin/reset-log`, `GET /admin/health`."""

    async def admin_log(request: Request) -> Response:
        return JSONResponse(log.entries)

    async def admin_reset_log(request: Request) -> Response:
        log.entries.clear()
        return JSONResponse({"ok": True})

    async def admin_health(request: Request) -> Response:
        return JSONResponse(health)

    return [
        Route("/admin/log", admin_log, methods=["GET"]),
        Route("/admin/reset-log", admin_reset_log, methods=["POST"]),
        Route("/admin/health", admin_health, methods=["GET"]),
    ]


def cache_hints(read_ttl_ms: int, list_ttl_ms: int) -> dict[str, CacheHint]:
    """The cache hints of a peer with every list kind: reads private for `read_ttl_ms`, lists public for
    `list_ttl_ms`."""
    list_hint = CacheHint(ttl_ms=list_ttl_ms, scope="public")
    return {
        "resources/read": CacheHint(ttl_ms=read_ttl_ms, scope="private"),
        "resources/list": list_hint,
        "resources/templates/list": list_hint,
        "tools/list": list_hint,
        "prompts/list": list_hint,
    }


def peer_parser(doc: str | None, eras: Sequence[str] = ("modern", "legacy")) -> argparse.ArgumentParser:
    """The command line every HTTP peer takes (`--port`, `--era`, `--read-ttl-ms`, `--list-ttl-ms`), described by
    the first line of its module's `doc`; `--era` is required where a peer serves more than one."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--port", type=int, required=True)
    if len(eras) > 1:
        parser.add_argument("--era", choices=list(eras), required=True)
    else:
        parser.add_argument("--era", choices=list(eras), default=eras[0])
    parser.add_argument("--read-ttl-ms", type=int, default=1000)
    parser.add_argument("--list-ttl-ms", type=int, default=1000)
    return parser


def serve(app: ASGIApp, port: int, **options: Any) -> None:
    """`app` on 127.0.0.1:`port` until the process is told to stop (uvicorn binds it itself: SO_REUSEADDR, so a
    restart on the same port works, and TCP_NODELAY); `options` go to uvicorn (its TLS settings)."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1, **options
    )
    uvicorn.Server(config).run()


def _answered(send: Send, entries: list[dict[str, Any]]) -> Send:
    """`send`, stamping `done` on the log entries of a request once its answer's body has ended."""
    if not entries:
        return send

    async def stamping(message: Message) -> None:
        await send(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            for entry in entries:
                entry["done"] = time.monotonic()

    return stamping
