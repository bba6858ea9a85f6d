"""The SDK 2.3 client (`mcp.Client`) as the compatibility suite drives it: what it sees, and how it watches.

    async with sdk_client(url, "2026") as client:     # default mode: must negotiate 2026-07-28 via the sidecar
        seen = await surface(client, up)              # every list, a read, a call and a prompt, comparable
    async with watching(url, "legacy", uri) as watch: # resources/subscribe; "2026": subscriptions/listen
        await watch.updated(within_s=1.0)             # the next notifications/resources/updated of `uri`

Both modes end up in the same `Watch` shape, so one test body covers the listen of a 2026 client and the
subscribe of a legacy one.
"""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import anyio
from mcp import Client
from mcp.client.subscriptions import ResourceUpdated, Subscription
from mcp.shared.exceptions import MCPDeprecationWarning
from pydantic import BaseModel

from tests.compat.upstreams import CompatUpstream, comparable
from tests.kit import UPDATED

__all__ = ["SdkMode", "Watch", "dump", "sdk_client", "surface", "text_of", "watching"]

SdkMode = Literal["2026", "legacy"]
"""`2026`: `Client`'s default mode (probes `server/discover`); `legacy`: the initialize handshake only."""


def sdk_client(url: str, mode: SdkMode, **options: Any) -> Client:
    """A client without a response cache (every read reaches the server) in `mode`."""
    return Client(url, cache=None, mode="auto" if mode == "2026" else "legacy", **options)


def dump(result: BaseModel) -> Any:
    """A result as the wire spells it, without the fields `comparable` ignores."""
    return comparable(result.model_dump(mode="json", by_alias=True, exclude_none=True))


async def surface(client: Client, up: CompatUpstream) -> dict[str, Any]:
    """What `client` sees of `up`: each list, the stable resource, the harmless tool call and the prompt."""
    tool, arguments = up.tool
    prompt, prompt_arguments = up.prompt
    return {
        "tools/list": dump(await client.list_tools()),
        "tools/call": dump(await client.call_tool(tool, arguments)),
        "resources/list": dump(await client.list_resources()),
        "resources/templates/list": dump(await client.list_resource_templates()),
        "resources/read": dump(await client.read_resource(up.stable_uri)),
        "prompts/list": dump(await client.list_prompts()),
        "prompts/get": dump(await client.get_prompt(prompt, prompt_arguments)),
    }


async def text_of(client: Client, uri: str) -> str:
    """The text of the first content of `uri`."""
    content = (await client.read_resource(uri)).contents[0]
    text = getattr(content, "text", None)
    assert isinstance(text, str), f"{uri} has no text content: {content}"
    return text


@dataclass
class Watch:
    """A client watching one URI: by a listen stream (2026) or a subscription on its session (legacy)."""

    client: Client
    uri: str
    subscription: Subscription | None = None
    """The listen stream (2026 mode)."""
    arrived: asyncio.Queue[str] | None = None
    """URIs of `resources/updated` notifications on the session (legacy mode)."""

    async def updated(self, within_s: float) -> None:
        """Until the next `resources/updated` of the URI; fails after `within_s`."""
        try:
            with anyio.fail_after(within_s):
                if self.subscription is not None:
                    while True:
                        event = await anext(self.subscription)
                        if isinstance(event, ResourceUpdated) and event.uri == self.uri:
                            return
                assert self.arrived is not None
                while await self.arrived.get() != self.uri:
                    pass
        except TimeoutError:
            how = "listen stream" if self.subscription is not None else "session (resources/subscribe)"
            raise AssertionError(f"no resources/updated for {self.uri} on the {how} within {within_s} s") from None


@contextlib.asynccontextmanager
async def watching(url: str, mode: SdkMode, uri: str) -> AsyncIterator[Watch]:
    """A connected client watching `uri` (acknowledged or subscribed) inside the block."""
    if mode == "2026":
        async with sdk_client(url, mode) as client, client.listen(resource_subscriptions=[uri]) as subscription:
            assert subscription.honored.resource_subscriptions == [uri], subscription.honored
            yield Watch(client, uri, subscription=subscription)
        return
    arrived: asyncio.Queue[str] = asyncio.Queue()

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == UPDATED:
            arrived.put_nowait(str(message.params.uri))

    async with sdk_client(url, mode, message_handler=on_message) as client:
        assert client.server_capabilities.resources is not None and client.server_capabilities.resources.subscribe
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)  # the SDK's nudge towards listen
            await client.subscribe_resource(uri)
        yield Watch(client, uri, arrived=arrived)
