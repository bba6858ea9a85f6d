"""A real MCP upstream built on the official SDK (mcp 2.3.0), run as a subprocess by the tests.

    python -m tests.peers.shop_server --port P --era modern|legacy [--read-ttl-ms N] [--list-ttl-ms N] [--auth]

``modern`` is the plain dual-era 2.3 server without subscriptions (2026-07-28 and the
handshake era). ``legacy`` puts an ASGI guard in front that answers any non-handshake
``MCP-Protocol-Version`` with 400 -32600, as mcp 1.x does, so it is a 2025-11-25-only server.

Tools: ``set_price``, ``bump_profile``, ``add_*`` and ``echo`` carry no annotations; ``lookup_price`` only reads
(``annotations.readOnlyHint: true``).

Resources (all text/plain): ``catalog://price`` (public), ``catalog://items/{sku}`` (public),
``catalog://profile`` (private; text depends on the caller's ``Authorization``),
``catalog://forbidden`` (every read fails with -32603), ``catalog://note`` (public; a note that can be deleted,
and then its reads fail with -32603 as basic-memory's do), ``catalog://stamped/{name}`` (JSON whose ``generatedAt``
differs on every read; its ``price`` is the price), plus whatever ``add_resource`` /
``add_template`` register. Unknown URIs get the SDK's not-found error (-32602).

Admin routes on the same port, JSON in and out: ``POST /admin/set {"price": n}``,
``POST /admin/note {"text": t | null, "fail_reads": n}`` (null deletes the note; its next n reads fail as if it were),
``POST /admin/profile {"token": t, "bump": true}``, ``POST /admin/add {"kind", "name"}``,
``GET /admin/log``, ``POST /admin/reset-log``, ``GET /admin/health``.

``--native`` (2026-07-28 only: the SDK serves listen on that era) makes it serve ``subscriptions/listen``
itself and announce every change it makes (``set``, ``set_price``, ``add``) as the SDK's events;
``POST /admin/notify {"uri"}`` or ``{"list": "tools"|"prompts"|"resources"}`` announces a change that
did not happen.

``--session-auth`` authenticates once per session, as some servers do: ``initialize`` needs an
``Authorization`` (any; 401 without), and every later request on that session is served as the client
that opened it, whatever ``Authorization`` it carries or lacks. ``catalog://profile`` names the caller's
token, taken from ``Authorization`` or else ``X-Api-Key``.

``--auth`` makes it an OAuth-protected resource (RFC 9728): every /mcp request needs
``Authorization: Bearer <token>`` with a token granted by ``POST /admin/grant {"token"}``; without one
it gets 401 and ``WWW-Authenticate: Bearer resource_metadata="http://127.0.0.1:P/.well-known/
oauth-protected-resource/mcp"`` (a document served there, and at the root well-known path).
``POST /admin/revoke {"token"}`` makes later requests with that token 401, ``POST /admin/forbid
{"token"}`` makes them 403 (``error="insufficient_scope"``). Requests are logged before the check.
"""

from __future__ import annotations

import contextvars
import json
import logging
import ssl
from collections.abc import Callable
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)
from mcp.types import (
    Completion,
    CompletionArgument,
    CompletionContext,
    PromptReference,
    ResourceTemplateReference,
    ToolAnnotations,
)
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router
from starlette.types import ASGIApp

from tests.peers.front import AdminLog, AuthState, Front, cache_hints, log_routes, peer_parser, serve

__all__ = ["ShopState", "build_app", "main"]

logger = logging.getLogger(__name__)

ANONYMOUS = "anonymous"
PUBLIC_URI_PREFIXES = ("catalog://price", "catalog://note", "catalog://items/", "catalog://extra/", "catalog://t/")
"""``resources/read`` of these URIs is ``cacheScope: public``; every other read is private."""

_authorization: contextvars.ContextVar[str | None] = contextvars.ContextVar("authorization", default=None)


class ShopState:
    """Mutable server state shared by tools, resources and admin routes."""

    def __init__(self) -> None:
        self.price = 100
        self.profile_versions: dict[str, int] = {}
        self.stamps = 0
        self.note: str | None = "note v1"
        self.note_failures = 0

    def profile_text(self, token: str) -> str:
        return f"profile of {token} v{self.profile_versions.get(token, 1)}"

    def bump_profile(self, token: str) -> int:
        self.profile_versions[token] = self.profile_versions.get(token, 1) + 1
        return self.profile_versions[token]


def _token(authorization: str | None) -> str:
    """The caller's token: the Authorization value without a ``Bearer`` prefix."""
    if not authorization:
        return ANONYMOUS
    return authorization.removeprefix("Bearer ").strip() or ANONYMOUS


def build_app(
    era: str,
    *,
    read_ttl_ms: int = 1000,
    list_ttl_ms: int = 1000,
    auth: bool = False,
    port: int = 0,
    native: bool = False,
    session_auth: bool = False,
) -> ASGIApp:
    """Build the shop server for ``era`` ("modern" or "legacy") as one ASGI app; ``auth`` protects /mcp (the
    ``port`` it is served on goes into its protected-resource metadata); ``native`` serves its own
    ``subscriptions/listen`` (2026-07-28) and announces every change it makes there."""
    if era not in ("modern", "legacy"):
        raise ValueError(f"era must be 'modern' or 'legacy', got {era!r}")
    bus = InMemorySubscriptionBus() if native else None

    async def announce(event: ServerEvent) -> None:
        if bus is not None:
            await bus.publish(event)

    state = ShopState()
    log = AdminLog()
    auth_state = AuthState(port) if auth else None

    async def per_uri_cache(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        request = ctx.request
        caller = None
        if isinstance(request, Request):  # who is asking: the Authorization, else an API key
            caller = request.headers.get("authorization") or request.headers.get("x-api-key")
        token = _authorization.set(caller)
        try:
            result = await call_next(ctx)
        finally:
            _authorization.reset(token)
        # Only 2026-era results carry ttlMs; the SDK has already sieved handshake-era ones.
        if ctx.method == "resources/read" and isinstance(result, dict) and "ttlMs" in result:
            uri = str((ctx.params or {}).get("uri", ""))
            scope = "public" if uri.startswith(PUBLIC_URI_PREFIXES) else "private"
            result = {**result, "ttlMs": read_ttl_ms, "cacheScope": scope}
        return result

    mcp = MCPServer(
        f"shop-{era}",
        version="0.1.0",
        subscriptions=bus if bus is not None else False,
        warn_on_duplicate_resources=False,
        warn_on_duplicate_tools=False,
        warn_on_duplicate_prompts=False,
        cache_hints=cache_hints(read_ttl_ms, list_ttl_ms),
        middleware=[per_uri_cache],
    )

    @mcp.resource("catalog://price", mime_type="text/plain", description="current price")
    def price() -> str:
        return f"price={state.price}"

    @mcp.resource("catalog://items/{sku}", mime_type="text/plain")
    def item(sku: str) -> str:
        return f"item {sku} costs {state.price}"

    @mcp.resource("catalog://stamped/{name}", mime_type="application/json")
    def stamped(name: str) -> str:
        # A volatile resource: every read carries a new stamp; only the price is a real change.
        state.stamps += 1
        return json.dumps({"name": name, "price": state.price, "generatedAt": state.stamps})

    @mcp.resource("catalog://profile", mime_type="text/plain", description="per-caller profile")
    def profile() -> str:
        return state.profile_text(_token(_authorization.get()))

    @mcp.resource("catalog://note", mime_type="text/plain", description="a note that can be deleted")
    def note() -> str:
        if state.note_failures > 0:
            state.note_failures -= 1
            raise ResourceError("note deleted")
        if state.note is None:
            raise ResourceError("note deleted")
        return state.note

    @mcp.resource("catalog://forbidden", mime_type="text/plain")
    def forbidden() -> str:
        raise ResourceError("access denied")

    def add(kind: str, name: str) -> str:
        if kind == "tool":

            def extra_tool() -> str:
                return f"tool {name}"

            mcp.add_tool(extra_tool, name=name, description=f"added tool {name}")
        elif kind == "prompt":

            def extra_prompt() -> str:
                return f"prompt {name}"

            mcp.prompt(name=name)(extra_prompt)
        elif kind == "resource":

            def extra_resource() -> str:
                return f"extra {name}"

            mcp.resource(f"catalog://extra/{name}", name=name, mime_type="text/plain")(extra_resource)
        elif kind == "template":

            def extra_template(id: str) -> str:
                return f"t {name} {id}"

            mcp.resource(f"catalog://t/{name}/{{id}}", name=f"t-{name}", mime_type="text/plain")(extra_template)
        else:
            raise ValueError(f"unknown kind {kind!r}")
        return f"added {kind} {name}"

    @mcp.tool()
    async def set_price(value: int) -> str:
        state.price = value
        await announce(ResourceUpdated(uri="catalog://price"))
        return f"price={value}"

    @mcp.tool()
    def bump_profile(token: str) -> str:
        return f"{token} v{state.bump_profile(token)}"

    @mcp.tool()
    def add_tool(name: str) -> str:
        return add("tool", name)

    @mcp.tool()
    def add_prompt(name: str) -> str:
        return add("prompt", name)

    @mcp.tool()
    def add_resource(name: str) -> str:
        return add("resource", name)

    @mcp.tool()
    def add_template(name: str) -> str:
        return add("template", name)

    @mcp.tool()
    def echo(text: str) -> str:
        return text

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
    def lookup_price() -> str:
        """Only reads: its tools/list entry says readOnlyHint: true."""
        return f"price={state.price}"

    @mcp.prompt()
    def pricing(sku: str) -> str:
        return f"What is the price of {sku}?"

    async def complete(
        ref: PromptReference | ResourceTemplateReference,
        argument: CompletionArgument,
        context: CompletionContext | None,
    ) -> Completion | None:
        if isinstance(ref, PromptReference) and ref.name == "pricing" and argument.name == "sku":
            return Completion(values=[v for v in ("a1", "a2") if v.startswith(argument.value)])
        return None

    register_completion: Callable[[Callable[..., Any]], object] = mcp.completion()  # type: ignore[no-untyped-call]
    register_completion(complete)

    async def admin_set(request: Request) -> Response:
        state.price = int((await request.json())["price"])
        await announce(ResourceUpdated(uri="catalog://price"))
        return JSONResponse({"price": state.price})

    async def admin_note(request: Request) -> Response:
        body = await request.json()
        if "text" in body:
            state.note = None if body["text"] is None else str(body["text"])
        state.note_failures = int(body.get("fail_reads", 0))
        return JSONResponse({"text": state.note, "fail_reads": state.note_failures})

    async def admin_notify(request: Request) -> Response:
        """Announce a change that did not happen (``{"uri": ...}``, or ``{"list": "tools"}``)."""
        body = await request.json()
        lists: dict[str, ServerEvent] = {
            "tools": ToolsListChanged(),
            "prompts": PromptsListChanged(),
            "resources": ResourcesListChanged(),
        }
        await announce(lists[body["list"]] if "list" in body else ResourceUpdated(uri=str(body["uri"])))
        return JSONResponse({"ok": True})

    async def admin_profile(request: Request) -> Response:
        body = await request.json()
        token = str(body["token"])
        if body.get("bump", True):
            state.bump_profile(token)
        return JSONResponse({"token": token, "text": state.profile_text(token)})

    async def admin_add(request: Request) -> Response:
        body = await request.json()
        try:
            result = add(str(body["kind"]), str(body["name"]))
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        changed: dict[str, ServerEvent] = {"tool": ToolsListChanged(), "prompt": PromptsListChanged()}
        await announce(changed.get(str(body["kind"]), ResourcesListChanged()))
        return JSONResponse({"result": result})

    def token_admin(change: Callable[[AuthState, str], None]) -> Callable[[Request], Any]:
        async def route(request: Request) -> Response:
            if auth_state is None:
                return JSONResponse({"error": "not started with --auth"}, status_code=400)
            token = str((await request.json())["token"])
            change(auth_state, token)
            return JSONResponse({"token": token, "granted": token in auth_state.granted})

        return route

    def revoke(state: AuthState, token: str) -> None:
        state.granted.discard(token)

    admin_grant = token_admin(lambda state, token: state.granted.add(token))
    admin_revoke = token_admin(revoke)
    admin_forbid = token_admin(lambda state, token: state.forbidden.add(token))

    admin = Router(
        routes=[
            Route("/admin/set", admin_set, methods=["POST"]),
            Route("/admin/notify", admin_notify, methods=["POST"]),
            Route("/admin/note", admin_note, methods=["POST"]),
            Route("/admin/profile", admin_profile, methods=["POST"]),
            Route("/admin/add", admin_add, methods=["POST"]),
            *log_routes(log, {"ok": True, "era": era}),
            Route("/admin/grant", admin_grant, methods=["POST"]),
            Route("/admin/revoke", admin_revoke, methods=["POST"]),
            Route("/admin/forbid", admin_forbid, methods=["POST"]),
        ]
    )
    front = Front(
        mcp.streamable_http_app(), admin, log, legacy=era == "legacy", auth=auth_state, session_auth=session_auth
    )
    return front


def main(argv: list[str] | None = None) -> None:
    parser = peer_parser(__doc__)
    parser.add_argument("--auth", action="store_true", help="require granted Bearer tokens (see the module doc)")
    parser.add_argument("--native", action="store_true", help="serve subscriptions/listen and announce changes")
    parser.add_argument("--session-auth", action="store_true", help="a session is its opener's (see the module doc)")
    parser.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate chain (and --tls-key)")
    parser.add_argument("--tls-key", help="the PEM private key of --tls-cert")
    parser.add_argument("--tls-client-ca", help="require a client certificate signed by this PEM CA")
    args = parser.parse_args(argv)
    app = build_app(
        args.era,
        read_ttl_ms=args.read_ttl_ms,
        list_ttl_ms=args.list_ttl_ms,
        auth=args.auth,
        port=args.port,
        native=args.native,
        session_auth=args.session_auth,
    )
    tls: dict[str, Any] = {}
    if args.tls_cert:
        tls = {"ssl_certfile": args.tls_cert, "ssl_keyfile": args.tls_key}
        if args.tls_client_ca:
            tls.update(ssl_ca_certs=args.tls_client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    serve(app, args.port, **tls)


if __name__ == "__main__":
    main()
