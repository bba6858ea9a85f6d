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

import argparse
import base64
import itertools
import json
import logging
import secrets
import warnings
from collections.abc import Callable
from typing import Any

import anyio
import uvicorn
from mcp.server.caching import CacheHint
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import UserMessage
from mcp.shared.exceptions import MCPError
from mcp.types import (
    AudioContent,
    CallToolResult,
    Completion,
    CompletionArgument,
    CompletionContext,
    CreateMessageRequest,
    CreateMessageRequestParams,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    EmbeddedResource,
    EmptyResult,
    ImageContent,
    InputRequest,
    InputRequiredResult,
    ListRootsRequest,
    PromptReference,
    ResourceTemplateReference,
    SamplingMessage,
    SetLevelRequestParams,
    TextContent,
    TextResourceContents,
)
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router
from starlette.types import ASGIApp

from tests.peers.shop_server import AdminLog, _Front

__all__ = ["build_app", "main"]

logger = logging.getLogger(__name__)

# A 1x1 PNG and a minimal WAV, base64 (what the scenarios' descriptions ask for: any valid data).
PNG_BASE64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
WAV_BASE64 = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="


def _text(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)])


def _elicit(message: str, properties: dict[str, Any], required: list[str]) -> InputRequest:
    schema = {"type": "object", "properties": properties, "required": required}
    return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema))


def _sample(text: str, max_tokens: int) -> InputRequest:
    message = SamplingMessage(role="user", content=TextContent(type="text", text=text))
    return CreateMessageRequest(params=CreateMessageRequestParams(messages=[message], max_tokens=max_tokens))


def _state(kind: str, **fields: Any) -> str:
    """A fresh requestState; the SDK seals it (integrity + confidentiality) before it leaves the server."""
    return json.dumps({"kind": kind, "nonce": secrets.token_hex(8), **fields})


def _read_state(raw: str | None) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _field(response: Any, name: str, default: str) -> str:
    """A string field of an elicitation answer's content."""
    if isinstance(response, ElicitResult) and isinstance(response.content, dict):
        value = response.content.get(name)
        if isinstance(value, str):
            return value
    return default


def build_app(era: str = "modern", *, read_ttl_ms: int = 1000, list_ttl_ms: int = 1000) -> ASGIApp:
    """The conformance fixture as one ASGI app (MCP on /mcp, admin routes on /admin/*)."""
    if era != "modern":
        raise ValueError("the conformance fixture is dual-era only (--era modern)")
    log = AdminLog()
    list_hint = CacheHint(ttl_ms=list_ttl_ms, scope="public")
    mcp = MCPServer(
        "conformance-fixture",
        version="0.1.0",
        subscriptions=False,
        cache_hints={
            "resources/read": CacheHint(ttl_ms=read_ttl_ms, scope="private"),
            "resources/list": list_hint,
            "resources/templates/list": list_hint,
            "tools/list": list_hint,
            "prompts/list": list_hint,
        },
    )
    dynamic = itertools.count(1)

    # -- content tools --------------------------------------------------------------------------------

    @mcp.tool(description="Returns simple text content")
    def test_simple_text() -> CallToolResult:
        return _text("This is a simple text response for testing.")

    @mcp.tool(description="Returns image content")
    def test_image_content() -> CallToolResult:
        return CallToolResult(content=[ImageContent(type="image", data=PNG_BASE64, mime_type="image/png")])

    @mcp.tool(description="Returns audio content")
    def test_audio_content() -> CallToolResult:
        return CallToolResult(content=[AudioContent(type="audio", data=WAV_BASE64, mime_type="audio/wav")])

    @mcp.tool(description="Returns an embedded resource")
    def test_embedded_resource() -> CallToolResult:
        resource = TextResourceContents(
            uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."
        )
        return CallToolResult(content=[EmbeddedResource(type="resource", resource=resource)])

    @mcp.tool(description="Returns text, image and resource content together")
    def test_multiple_content_types() -> CallToolResult:
        resource = TextResourceContents(
            uri="test://mixed-content-resource",
            mime_type="application/json",
            text=json.dumps({"test": "data", "value": 123}),
        )
        return CallToolResult(
            content=[
                TextContent(type="text", text="Multiple content types test:"),
                ImageContent(type="image", data=PNG_BASE64, mime_type="image/png"),
                EmbeddedResource(type="resource", resource=resource),
            ]
        )

    @mcp.tool(description="Always fails (isError: true)")
    def test_error_handling() -> str:
        raise RuntimeError("This tool intentionally returns an error for testing")

    @mcp.tool(description="Reports progress 0, 50 and 100 of 100")
    async def test_tool_with_progress(ctx: Context) -> str:
        for step in (0, 50, 100):
            await ctx.report_progress(step, 100, f"Completed step {step} of 100")
            if step < 100:
                await anyio.sleep(0.05)
        return "progress complete"

    @mcp.tool(description="Sends three info log messages while running")
    async def test_tool_with_logging(ctx: Context) -> str:
        for index, text in enumerate(("Tool execution started", "Tool processing data", "Tool execution completed")):
            await _log(ctx, text)
            if index < 2:
                await anyio.sleep(0.05)
        return "Tool with logging executed successfully"

    # -- handshake-era server-to-client requests (2025-11-25 scenarios) --------------------------------

    @mcp.tool(description="Asks the client's LLM (sampling/createMessage)")
    async def test_sampling(prompt: str, ctx: Context) -> str:
        message = SamplingMessage(role="user", content=TextContent(type="text", text=prompt))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = await ctx.session.create_message([message], max_tokens=100, related_request_id=ctx.request_id)
        content = result.content
        text = content.text if isinstance(content, TextContent) else "No response"
        return f"LLM response: {text}"

    @mcp.tool(description="Asks the user (elicitation/create)")
    async def test_elicitation(message: str, ctx: Context) -> str:
        schema = {
            "type": "object",
            "properties": {"response": {"type": "string", "description": "User's response"}},
            "required": ["response"],
        }
        result = await _elicit_raw(ctx, message, schema)
        return f"User response: action={result.action}, content={json.dumps(result.content or {})}"

    @mcp.tool(description="Elicitation with defaults for every primitive type (SEP-1034)")
    async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
        schema = {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "User name", "default": "John Doe"},
                "age": {"type": "integer", "description": "User age", "default": 30},
                "score": {"type": "number", "description": "User score", "default": 95.5},
                "status": {
                    "type": "string",
                    "description": "User status",
                    "enum": ["active", "inactive", "pending"],
                    "default": "active",
                },
                "verified": {"type": "boolean", "description": "Verification status", "default": True},
            },
            "required": [],
        }
        result = await _elicit_raw(ctx, "Please review and update the form fields with defaults", schema)
        return f"Elicitation completed: action={result.action}, content={json.dumps(result.content or {})}"

    @mcp.tool(description="Elicitation with the five enum schema forms (SEP-1330)")
    async def test_elicitation_sep1330_enums(ctx: Context) -> str:
        options = ["option1", "option2", "option3"]
        schema = {
            "type": "object",
            "properties": {
                "untitledSingle": {"type": "string", "description": "Select one option", "enum": options},
                "titledSingle": {
                    "type": "string",
                    "description": "Select one option with titles",
                    "oneOf": [
                        {"const": "value1", "title": "First Option"},
                        {"const": "value2", "title": "Second Option"},
                        {"const": "value3", "title": "Third Option"},
                    ],
                },
                "legacyEnum": {
                    "type": "string",
                    "description": "Select one option (legacy)",
                    "enum": ["opt1", "opt2", "opt3"],
                    "enumNames": ["Option One", "Option Two", "Option Three"],
                },
                "untitledMulti": {
                    "type": "array",
                    "description": "Select multiple options",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {"type": "string", "enum": options},
                },
                "titledMulti": {
                    "type": "array",
                    "description": "Select multiple options with titles",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {
                        "anyOf": [
                            {"const": "value1", "title": "First Choice"},
                            {"const": "value2", "title": "Second Choice"},
                            {"const": "value3", "title": "Third Choice"},
                        ]
                    },
                },
            },
            "required": [],
        }
        result = await _elicit_raw(ctx, "Please select options from the enum fields", schema)
        return f"Elicitation completed: action={result.action}, content={json.dumps(result.content or {})}"

    # -- 2026-07-28 diagnostic tools (server-stateless) ---------------------------------------------------

    @mcp.tool(description="Needs the client's sampling capability (-32021 without it)")
    def test_missing_capability(ctx: Context) -> str:
        capabilities = ctx.client_capabilities
        if capabilities is None or capabilities.sampling is None:
            raise MCPError(
                code=-32021,
                message="Missing required client capability: sampling",
                data={"requiredCapabilities": {"sampling": {}}},
            )
        return "Success"

    @mcp.tool(description="Answers on its response stream with notifications only, never a request")
    async def test_streaming_elicitation(ctx: Context) -> str:
        await ctx.report_progress(50, 100)  # sent only when the request carried a progressToken
        return "Streaming complete"

    @mcp.tool(description="Logs only when the request's _meta asked for a log level")
    async def test_logging_tool(ctx: Context) -> str:
        await _log(ctx, "Diagnostic trace logging activated")  # the SDK drops it without _meta logLevel
        return "Logging evaluated"

    @mcp.tool(description="Adds a tool, so the tool list changes")
    def test_trigger_tool_change() -> str:
        name = f"test_dynamic_tool_{next(dynamic)}"

        def dynamic_tool() -> str:
            return f"{name} called"

        mcp.add_tool(dynamic_tool, name=name, description=f"Added by test_trigger_tool_change ({name})")
        return f"Mutation triggered: added tool {name}"

    @mcp.tool(description="Adds a prompt, so the prompt list changes")
    def test_trigger_prompt_change() -> str:
        name = f"test_dynamic_prompt_{next(dynamic)}"

        def dynamic_prompt() -> str:
            return f"{name} text"

        mcp.prompt(name=name, description=f"Added by test_trigger_prompt_change ({name})")(dynamic_prompt)
        return f"Mutation triggered: added prompt {name}"

    # -- SEP-2322 InputRequiredResult (multi round-trip) tools ---------------------------------------------

    @mcp.tool(description="MRTR: asks for a name by elicitation")
    def test_input_required_result_elicitation(ctx: Context) -> CallToolResult | InputRequiredResult:
        answer = (ctx.input_responses or {}).get("user_name")
        if isinstance(answer, ElicitResult):
            return _text(f"Hello, {_field(answer, 'name', 'unknown')}!")
        return InputRequiredResult(
            input_requests={"user_name": _elicit("What is your name?", {"name": {"type": "string"}}, ["name"])}
        )

    @mcp.tool(description="MRTR: asks the client's LLM")
    def test_input_required_result_sampling(ctx: Context) -> CallToolResult | InputRequiredResult:
        answer = (ctx.input_responses or {}).get("sample_request")
        if answer is not None and not isinstance(answer, ElicitResult) and hasattr(answer, "content"):
            content = answer.content
            text = content.text if isinstance(content, TextContent) else "no response"
            return _text(f"Sampling result: {text}")
        return InputRequiredResult(input_requests={"sample_request": _sample("What is the capital of France?", 100)})

    @mcp.tool(description="MRTR: asks for the client's roots")
    def test_input_required_result_list_roots(ctx: Context) -> CallToolResult | InputRequiredResult:
        answer = (ctx.input_responses or {}).get("roots_request")
        roots = getattr(answer, "roots", None)
        if roots is not None:
            return _text(f"Found {len(roots)} root(s)")
        return InputRequiredResult(input_requests={"roots_request": ListRootsRequest()})

    @mcp.tool(description="MRTR: round-trips requestState")
    def test_input_required_result_request_state(ctx: Context) -> CallToolResult | InputRequiredResult:
        answer = (ctx.input_responses or {}).get("confirm")
        state = _read_state(ctx.request_state)
        if state.get("kind") == "request-state" and isinstance(answer, ElicitResult):
            if isinstance(answer.content, dict) and answer.content.get("ok") is True:
                return _text("state-ok: requestState validated")
        return InputRequiredResult(
            input_requests={"confirm": _elicit("Please confirm", {"ok": {"type": "boolean"}}, ["ok"])},
            request_state=_state("request-state"),
        )

    @mcp.tool(description="MRTR: elicitation, sampling and roots in one round")
    def test_input_required_result_multiple_inputs(ctx: Context) -> CallToolResult | InputRequiredResult:
        answers = ctx.input_responses or {}
        state = _read_state(ctx.request_state)
        if state.get("kind") == "multiple-inputs" and {"user_name", "greeting", "client_roots"} <= answers.keys():
            greeting = getattr(answers["greeting"], "content", None)
            greeting_text = greeting.text if isinstance(greeting, TextContent) else "Hello there!"
            roots = getattr(answers["client_roots"], "roots", None) or []
            name = _field(answers["user_name"], "name", "unknown")
            return _text(f"Name: {name}; Greeting: {greeting_text}; Roots: {len(roots)}")
        return InputRequiredResult(
            input_requests={
                "user_name": _elicit("What is your name?", {"name": {"type": "string"}}, ["name"]),
                "greeting": _sample("Generate a greeting", 50),
                "client_roots": ListRootsRequest(),
            },
            request_state=_state("multiple-inputs"),
        )

    @mcp.tool(description="MRTR: two rounds of elicitation, then a result")
    def test_input_required_result_multi_round(ctx: Context) -> CallToolResult | InputRequiredResult:
        answers = ctx.input_responses or {}
        state = _read_state(ctx.request_state)
        if state.get("round") == 1 and isinstance(answers.get("step1"), ElicitResult):
            name = _field(answers["step1"], "name", "friend")
            return InputRequiredResult(
                input_requests={
                    "step2": _elicit("Step 2: What is your favorite color?", {"color": {"type": "string"}}, ["color"])
                },
                request_state=_state("multi-round", round=2, name=name),
            )
        if state.get("round") == 2 and isinstance(answers.get("step2"), ElicitResult):
            color = _field(answers["step2"], "color", "unknown")
            return _text(f"Multi-round complete for {state.get('name', 'friend')} who likes {color}")
        return InputRequiredResult(
            input_requests={"step1": _elicit("Step 1: What is your name?", {"name": {"type": "string"}}, ["name"])},
            request_state=_state("multi-round", round=1),
        )

    @mcp.tool(description="MRTR: integrity-protected requestState (the SDK rejects a tampered one)")
    def test_input_required_result_tampered_state(ctx: Context) -> CallToolResult | InputRequiredResult:
        state = _read_state(ctx.request_state)
        if state.get("kind") == "tamper-test" and isinstance((ctx.input_responses or {}).get("confirm"), ElicitResult):
            return _text("integrity-ok: state verified")
        return InputRequiredResult(
            input_requests={"confirm": _elicit("Please confirm", {"ok": {"type": "boolean"}}, ["ok"])},
            request_state=_state("tamper-test"),
        )

    @mcp.tool(description="MRTR: asks only for what the client's capabilities allow")
    def test_input_required_result_capabilities(ctx: Context) -> CallToolResult | InputRequiredResult:
        if ctx.input_responses:
            return _text(f"capabilities-ok: received {','.join(ctx.input_responses)}")
        capabilities = ctx.client_capabilities
        requests: dict[str, InputRequest] = {}
        if capabilities is not None and capabilities.elicitation is not None:
            requests["elicit_input"] = _elicit("Elicitation input", {"value": {"type": "string"}}, ["value"])
        if capabilities is not None and capabilities.sampling is not None:
            requests["sample_input"] = _sample("Sample request", 50)
        if not requests:
            return _text("No supported capabilities declared")
        return InputRequiredResult(input_requests=requests, request_state=_state("capabilities-test"))

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
            text = f"Prompt with context: {_field(answer, 'context', 'unknown')}"
            return [UserMessage(TextContent(type="text", text=text))]
        return InputRequiredResult(
            input_requests={
                "user_context": _elicit(
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

    async def admin_log(request: Request) -> Response:
        return JSONResponse(log.entries)

    async def admin_reset_log(request: Request) -> Response:
        log.entries.clear()
        return JSONResponse({"ok": True})

    async def admin_health(request: Request) -> Response:
        return JSONResponse({"ok": True, "era": era, "fixture": "conformance"})

    admin = Router(
        routes=[
            Route("/admin/log", admin_log, methods=["GET"]),
            Route("/admin/reset-log", admin_reset_log, methods=["POST"]),
            Route("/admin/health", admin_health, methods=["GET"]),
        ]
    )
    return _Front(mcp.streamable_http_app(), admin, log, legacy=False)


async def _log(ctx: Context, text: str) -> None:
    # Logging is deprecated at 2026-07-28 (the SDK sends it there only when the request's _meta asks).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        await ctx.info(text)


async def _elicit_raw(ctx: Context, message: str, schema: dict[str, Any]) -> ElicitResult:
    """elicitation/create with a schema given as JSON (the scenarios check its exact keywords)."""
    result: ElicitResult = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--era", choices=["modern"], default="modern")
    parser.add_argument("--read-ttl-ms", type=int, default=1000)
    parser.add_argument("--list-ttl-ms", type=int, default=1000)
    args = parser.parse_args(argv)
    app = build_app(args.era, read_ttl_ms=args.read_ttl_ms, list_ttl_ms=args.list_ttl_ms)
    config = uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning", timeout_graceful_shutdown=1)
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
