"""The conformance fixture's tools: content kinds, error, progress and logging, the handshake era's
server-to-client requests, the 2026-07-28 diagnostic tools, and the SEP-2322 `InputRequiredResult` tools
(named and shaped after the suite's scenario descriptions; see `conformance_server`)."""

from __future__ import annotations

import itertools
import json
import logging
import secrets
import warnings
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import (
    AudioContent,
    CallToolResult,
    CreateMessageRequest,
    CreateMessageRequestParams,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    EmbeddedResource,
    ImageContent,
    InputRequest,
    InputRequiredResult,
    ListRootsRequest,
    SamplingMessage,
    TextContent,
    TextResourceContents,
)

__all__ = ["PNG_BASE64", "WAV_BASE64", "add_tools", "answer_field", "elicit_input"]

logger = logging.getLogger(__name__)

# A 1x1 PNG and a minimal WAV, base64 (what the scenarios' descriptions ask for: any valid data).
PNG_BASE64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
WAV_BASE64 = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="


def _text(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)])


def elicit_input(message: str, properties: dict[str, Any], required: list[str]) -> InputRequest:
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


def answer_field(response: Any, name: str, default: str) -> str:
    """A string field of an elicitation answer's content."""
    if isinstance(response, ElicitResult) and isinstance(response.content, dict):
        value = response.content.get(name)
        if isinstance(value, str):
            return value
    return default


def add_tools(mcp: MCPServer) -> None:
    """Every `test_*` tool of the fixture, on `mcp`."""
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
            return _text(f"Hello, {answer_field(answer, 'name', 'unknown')}!")
        return InputRequiredResult(
            input_requests={"user_name": elicit_input("What is your name?", {"name": {"type": "string"}}, ["name"])}
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
            input_requests={"confirm": elicit_input("Please confirm", {"ok": {"type": "boolean"}}, ["ok"])},
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
            name = answer_field(answers["user_name"], "name", "unknown")
            return _text(f"Name: {name}; Greeting: {greeting_text}; Roots: {len(roots)}")
        return InputRequiredResult(
            input_requests={
                "user_name": elicit_input("What is your name?", {"name": {"type": "string"}}, ["name"]),
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
            name = answer_field(answers["step1"], "name", "friend")
            return InputRequiredResult(
                input_requests={
                    "step2": elicit_input(
                        "Step 2: What is your favorite color?", {"color": {"type": "string"}}, ["color"]
                    )
                },
                request_state=_state("multi-round", round=2, name=name),
            )
        if state.get("round") == 2 and isinstance(answers.get("step2"), ElicitResult):
            color = answer_field(answers["step2"], "color", "unknown")
            return _text(f"Multi-round complete for {state.get('name', 'friend')} who likes {color}")
        return InputRequiredResult(
            input_requests={
                "step1": elicit_input("Step 1: What is your name?", {"name": {"type": "string"}}, ["name"])
            },
            request_state=_state("multi-round", round=1),
        )

    @mcp.tool(description="MRTR: integrity-protected requestState (the SDK rejects a tampered one)")
    def test_input_required_result_tampered_state(ctx: Context) -> CallToolResult | InputRequiredResult:
        state = _read_state(ctx.request_state)
        if state.get("kind") == "tamper-test" and isinstance((ctx.input_responses or {}).get("confirm"), ElicitResult):
            return _text("integrity-ok: state verified")
        return InputRequiredResult(
            input_requests={"confirm": elicit_input("Please confirm", {"ok": {"type": "boolean"}}, ["ok"])},
            request_state=_state("tamper-test"),
        )

    @mcp.tool(description="MRTR: asks only for what the client's capabilities allow")
    def test_input_required_result_capabilities(ctx: Context) -> CallToolResult | InputRequiredResult:
        if ctx.input_responses:
            return _text(f"capabilities-ok: received {','.join(ctx.input_responses)}")
        capabilities = ctx.client_capabilities
        requests: dict[str, InputRequest] = {}
        if capabilities is not None and capabilities.elicitation is not None:
            requests["elicit_input"] = elicit_input("Elicitation input", {"value": {"type": "string"}}, ["value"])
        if capabilities is not None and capabilities.sampling is not None:
            requests["sample_input"] = _sample("Sample request", 50)
        if not requests:
            return _text("No supported capabilities declared")
        return InputRequiredResult(input_requests=requests, request_state=_state("capabilities-test"))


async def _log(ctx: Context, text: str) -> None:
    # Logging is deprecated at 2026-07-28 (the SDK sends it there only when the request's _meta asks).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        await ctx.info(text)


async def _elicit_raw(ctx: Context, message: str, schema: dict[str, Any]) -> ElicitResult:
    """elicitation/create with a schema given as JSON (the scenarios check its exact keywords)."""
    result: ElicitResult = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
    return result
