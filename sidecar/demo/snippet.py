"""The Python client a newcomer runs first, with the official SDK: the README shows it for `catalog://price`, the
demo prints it for its own URL and URI. One text, so the two never drift (tests/repo holds them together)."""

from __future__ import annotations

__all__ = ["sdk_snippet"]

_SNIPPET = """\
import anyio
from mcp import Client, MCPError
from mcp.client.subscriptions import ResourceUpdated

URIS = ["{uri}"]


async def main() -> None:
    async with Client("{url}") as client:
        async with client.listen(resource_subscriptions=URIS) as subscription:
            watching = subscription.honored.resource_subscriptions or []
            print("watching", watching)
            for uri in sorted(set(URIS) - set(watching)):  # left out of the ack: a read says why
                try:
                    await client.read_resource(uri)
                    print(uri, "left out: see the sidecar's log")
                except MCPError as exc:
                    print(uri, "left out:", exc)
            async for event in subscription:  # one event per change; it carries no content,
                if isinstance(event, ResourceUpdated):
                    result = await client.read_resource(event.uri)  # so re-read
                    print(event.uri, "is now", result.contents[0].text)


anyio.run(main)"""


def sdk_snippet(url: str, uri: str) -> str:
    """A script that listens to `uri` through the sidecar at `url` and re-reads it after each change; a URI left
    out of the ack is read once, so its error says why (the SDK keeps the ack's reasons to itself)."""
    return _SNIPPET.format(url=url, uri=uri)
