"""A genuine 1.x SDK client (mcp 1.30) that runs a scripted sequence and prints one JSON line per step.

    .tools/venv-mcp1/bin/python tests/peers/mcp1_client.py URL [--call NAME ARGS_JSON] [--read URI ...]
        [--prompt NAME ARGS_JSON] [--subscribe URI [--trigger NAME ARGS_JSON] [--wait-updated SECONDS]]

Run with the 1.x venv's Python (`bash .ci/install-peers`); it imports nothing from this repository. Steps, in
order, each printed as `{"step": NAME, ...}` when done (results as the SDK's models dump them, by alias):

    initialize  tools/list  [tools/call]  resources/list  resources/templates/list  [resources/read per --read]
    prompts/list  [prompts/get]
    with --subscribe: resources/subscribe, then `subscribed` (the client now waits: make the change), then
    [`triggered`: --trigger's tool was called through this same session], `updated` once
    `notifications/resources/updated` for the URI arrived (`after_s`: seconds since `subscribed`, or since
    the trigger call began), then `reread` (resources/read of the URI again)
    done

A failure prints `{"step": "error", "at": STEP, "error": ...}` and exits 1; a wait that runs out prints
`{"step": "error", "at": "updated", ...}` too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.session import RequestResponder
from mcp.types import ClientResult, ServerNotification, ServerRequest
from pydantic import AnyUrl, BaseModel

__all__ = ["main"]


def _emit(step: str, **fields: Any) -> None:
    print(json.dumps({"step": step, **fields}, sort_keys=True), flush=True)


def _dump(result: BaseModel) -> dict[str, Any]:
    dumped: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


class _Updates:
    """`notifications/resources/updated` URIs as they arrive (other messages are ignored)."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.changed = anyio.Event()

    async def __call__(
        self, message: RequestResponder[ServerRequest, ClientResult] | ServerNotification | Exception
    ) -> None:
        if isinstance(message, ServerNotification) and message.root.method == "notifications/resources/updated":
            self.arrived.setdefault(str(message.root.params.uri), time.monotonic())
            self.changed.set()
            self.changed = anyio.Event()

    async def wait(self, uri: str) -> float:
        """The monotonic time the first update of `uri` arrived (waits for it)."""
        while uri not in self.arrived:
            await self.changed.wait()
        return self.arrived[uri]


async def _run(args: argparse.Namespace, updates: _Updates, at: list[str]) -> None:
    async with (
        streamable_http_client(args.url) as (read, write, session_id),
        ClientSession(read, write, message_handler=updates) as session,
    ):
        at[0] = "initialize"
        init = await session.initialize()
        _emit("initialize", result=_dump(init), session=session_id() is not None)
        at[0] = "tools/list"
        _emit("tools/list", result=_dump(await session.list_tools()))
        if args.call:
            at[0] = "tools/call"
            name, arguments = args.call
            _emit("tools/call", name=name, result=_dump(await session.call_tool(name, json.loads(arguments))))
        at[0] = "resources/list"
        _emit("resources/list", result=_dump(await session.list_resources()))
        at[0] = "resources/templates/list"
        _emit("resources/templates/list", result=_dump(await session.list_resource_templates()))
        for uri in args.read:
            at[0] = "resources/read"
            _emit("resources/read", uri=uri, result=_dump(await session.read_resource(AnyUrl(uri))))
        at[0] = "prompts/list"
        _emit("prompts/list", result=_dump(await session.list_prompts()))
        if args.prompt:
            at[0] = "prompts/get"
            name, arguments = args.prompt
            _emit("prompts/get", name=name, result=_dump(await session.get_prompt(name, json.loads(arguments))))
        if args.subscribe:
            at[0] = "resources/subscribe"
            uri = str(AnyUrl(args.subscribe))  # as the SDK will spell it in the notification
            await session.subscribe_resource(AnyUrl(uri))
            started = time.monotonic()
            _emit("subscribed", uri=uri)
            if args.trigger:
                at[0] = "trigger"
                name, arguments = args.trigger
                started = time.monotonic()
                result = await session.call_tool(name, json.loads(arguments))
                _emit("triggered", name=name, result=_dump(result))
            at[0] = "updated"
            with anyio.fail_after(args.wait_updated):
                arrived = await updates.wait(uri)
            _emit("updated", uri=uri, after_s=round(arrived - started, 4))
            at[0] = "reread"
            _emit("reread", uri=uri, result=_dump(await session.read_resource(AnyUrl(uri))))
        at[0] = "done"
        _emit("done")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("url")
    parser.add_argument("--call", nargs=2, metavar=("NAME", "ARGS_JSON"), help="a tools/call after tools/list")
    parser.add_argument("--read", action="append", default=[], metavar="URI", help="a resources/read (repeatable)")
    parser.add_argument("--prompt", nargs=2, metavar=("NAME", "ARGS_JSON"), help="a prompts/get after prompts/list")
    parser.add_argument("--subscribe", metavar="URI", help="subscribe, then wait for its resources/updated")
    parser.add_argument("--trigger", nargs=2, metavar=("NAME", "ARGS_JSON"), help="a tool to call once subscribed")
    parser.add_argument("--wait-updated", type=float, default=10.0, metavar="SECONDS", help="bound on that wait")
    args = parser.parse_args(argv)
    updates = _Updates()
    at = ["connect"]
    try:
        anyio.run(_run, args, updates, at)
    except Exception as exc:  # the report boundary: every failure becomes a step the test can read
        while isinstance(exc, ExceptionGroup) and exc.exceptions:  # the task group wraps the real error
            exc = exc.exceptions[0]
        error = "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
        _emit("error", at=at[0], error=error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
