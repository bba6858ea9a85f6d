"""An upstream offering what the official conformance suite's server scenarios call, for the sidecar to front.

    python -m tests.peers.conformance_server --port P [--era modern] [--read-ttl-ms N] [--list-ttl-ms N]

Built on the official SDK (mcp 2.3) as ``MCPServer(subscriptions=False)``: dual-era (2026-07-28 and
the handshake era), with no ``subscriptions/listen``, no ``resources/subscribe`` and no list-changed
notifications, so everything the suite checks about subscriptions is the sidecar's own work.

The names and shapes follow the descriptions in the suite's scenarios
(``@modelcontextprotocol/conformance`` 0.2.0-alpha.12): ``test_*`` tools (content kinds, error,
progress, logging, sampling, elicitation, the SEP-2322 ``InputRequiredResult`` tools, the diagnostic
tools of ``server-stateless``), ``test://`` resources and a template, ``test_*`` prompts and a
completion handler. Written from those descriptions; none of the suite's own fixture code is used.

``test_trigger_tool_change`` and ``test_trigger_prompt_change`` really add a tool or a prompt, so
the list a poll reads changes (the sidecar's revalidate-on-write turns that into list_changed).

Admin routes (shared plumbing with the shop server): ``GET /admin/health``, ``GET /admin/log``,
``POST /admin/reset-log``.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import UserMessage
from mcp.types import (
    Completion,
    CompletionArgument,
    CompletionContext,
    ElicitResult,
    EmbeddedResource,
    EmptyResult,
    ImageContent,
    InputRequiredResult,
    PromptReference,
    ResourceTemplateReference,
    SetLevelRequestParams,
    TextContent,
    TextResourceContents,
)
from starlette.routing import Router
from starlette.types import ASGIApp

from tests.peers.conformance_tools import PNG_BASE64, add_tools, answer_field, elicit_input
from tests.peers.front import AdminLog, Front, cache_hints, log_routes, peer_parser, serve

__all__ = ["build_app", "main"]

logger = logging.getLogger(__name__)


def build_app(era: str = "modern", *, read_ttl_ms: int = 1000, list_ttl_ms: int = 1000) -> ASGIApp:
    """The conformance fixture as one ASGI app (MCP on /mcp, admin routes on /admin/*)."""
    if era != "modern":
        raise ValueError("the conformance fixture is dual-era only (--era modern)")
    log = AdminLog()
    mcp = MCPServer(
        "conformance-fixture",
        version="0.1.0",
        subscriptions=False,
        cache_hints=cache_hints(read_ttl_ms, list_ttl_ms),
    )
    add_tools(mcp)

    # -- resources --------------------------------------------------------------------------------------

    @mcp.resource("test://static-text", name="static-text", mime_type="text/plain", description="Static text")
    def static_text() -> str:
        return "This is the content of the static text resource."

    @mcp.resource("test://static-binary", name="static-binary", mime_type="image/png", description="Static PNG")
    def static_binary() -> bytes:
        return base64.b64decode(PNG_BASE64)

    @mcp.resource(
        "test://template/{id}/data", name="template", mime_type="application/json", description="Template by id"
    )
    def template(id: str) -> str:
        return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})

    @mcp.resource(
        "test://watched-resource", name="watched-resource", mime_type="text/plain", description="For subscriptions"
    )
    def watched_resource() -> str:
        return "Watched resource content"

    # -- prompts ----------------------------------------------------------------------------------------

    @mcp.prompt(description="A prompt without arguments")
    def test_simple_prompt() -> list[UserMessage]:
        return [UserMessage(TextContent(type="text", text="This is a simple prompt for testing."))]

    @mcp.prompt(description="A prompt with two required arguments")
    def test_prompt_with_arguments(arg1: str, arg2: str) -> list[UserMessage]:
        text = f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"
        return [UserMessage(TextContent(type="text", text=text))]

    @mcp.prompt(description="A prompt embedding the resource it is given")
    def test_prompt_with_embedded_resource(
        resourceUri: str,
    ) -> list[UserMessage]:  # resourceUri: the argument's wire name
        resource = TextResourceContents(
            uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."
        )
        return [
            UserMessage(EmbeddedResource(type="resource", resource=resource)),
            UserMessage(TextContent(type="text", text="Please process the embedded resource.")),
        ]

    @mcp.prompt(description="A prompt with image content")
    def test_prompt_with_image() -> list[UserMessage]:
        return [
            UserMessage(ImageContent(type="image", data=PNG_BASE64, mime_type="image/png")),
            UserMessage(TextContent(type="text", text="Please analyze the image above.")),
        ]

    @mcp.prompt(description="MRTR: a prompt that needs elicitation input")
    def test_input_required_result_prompt(ctx: Context) -> list[UserMessage] | InputRequiredResult:
        answer = (ctx.input_responses or {}).get("user_context")
        if isinstance(answer, ElicitResult):
            text = f"Prompt with context: {answer_field(answer, 'context', 'unknown')}"
            return [UserMessage(TextContent(type="text", text=text))]
        return InputRequiredResult(
            input_requests={
                "user_context": elicit_input(
                    "What context should the prompt use?", {"context": {"type": "string"}}, ["context"]
                )
            }
        )

    # -- completion and logging/setLevel ------------------------------------------------------------------

    async def complete(
        ref: PromptReference | ResourceTemplateReference,
        argument: CompletionArgument,
        context: CompletionContext | None,
    ) -> Completion | None:
        if isinstance(ref, PromptReference) and ref.name == "test_prompt_with_arguments":
            values = [v for v in ("test-value", "testing", "paris") if v.startswith(argument.value)]
            return Completion(values=values, total=len(values), has_more=False)
        return Completion(values=[], total=0, has_more=False)

    register_completion: Callable[[Callable[..., Any]], object] = mcp.completion()  # type: ignore[no-untyped-call]
    register_completion(complete)

    async def set_level(ctx: ServerRequestContext[Any, Any], params: SetLevelRequestParams) -> EmptyResult:
        return EmptyResult()

    # MCPServer has no logging/setLevel of its own (deprecated at 2026-07-28); the handshake-era
    # `logging-set-level` scenario needs one, so it goes on the lowlevel server underneath.
    mcp._lowlevel_server.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)

    # -- admin ----------------------------------------------------------------------------------------

    admin = Router(
        routes=[
            *log_routes(log, {"ok": True, "era": era, "fixture": "conformance"}),
        ]
    )
    return Front(mcp.streamable_http_app(), admin, log, legacy=False)


def main(argv: list[str] | None = None) -> None:
    args = peer_parser(__doc__, eras=["modern"]).parse_args(argv)
    app = build_app(args.era, read_ttl_ms=args.read_ttl_ms, list_ttl_ms=args.list_ttl_ms)
    serve(app, args.port)


if __name__ == "__main__":
    main()
