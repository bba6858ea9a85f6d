"""The wire as the tests speak it: the protocol's constants, the headers and the request bodies of both eras.

Written once so that a test says what it sends (`request("resources/read", {"uri": uri})`, `listen_request([uri])`)
and a change of the wire is one edit here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import aiohttp

__all__ = [
    "ACK",
    "LEGACY_HEADERS",
    "LEGACY_INITIALIZE",
    "META",
    "PROMPTS_CHANGED",
    "PV",
    "RESOURCES_CHANGED",
    "SUB_ID_KEY",
    "TOOLS_CHANGED",
    "UPDATED",
    "headers",
    "listen_request",
    "read_resource",
    "readyz",
    "request",
    "rpc",
    "text_of",
]

PV = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": PV,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "tests", "version": "0"},
}
SUB_ID_KEY = "io.modelcontextprotocol/subscriptionId"
ACK = "notifications/subscriptions/acknowledged"
UPDATED = "notifications/resources/updated"
TOOLS_CHANGED = "notifications/tools/list_changed"
PROMPTS_CHANGED = "notifications/prompts/list_changed"
RESOURCES_CHANGED = "notifications/resources/list_changed"
LEGACY_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}
"""A 2025-11-25 client's first message, as raw JSON."""
LEGACY_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
"""The headers of a 2025-11-25 client's POST (plus Mcp-Session-Id and MCP-Protocol-Version after initialize)."""


def headers(method: str, name: str | None = None, **extra: str) -> dict[str, str]:
    """A 2026-07-28 POST's headers: the protocol version, `Mcp-Method` and (for a named call) `Mcp-Name`."""
    h = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": PV,
        "Mcp-Method": method,
    }
    if name is not None:
        h["Mcp-Name"] = name
    h.update(extra)
    return h


def request(method: str, params: dict[str, Any] | None = None, request_id: Any = 1) -> dict[str, Any]:
    """A 2026-07-28 request: `params` with the per-request `_meta` every such request carries."""
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**(params or {}), "_meta": META}}


def listen_request(uris: Iterable[str] | None = (), request_id: Any = 1, **lists: bool) -> dict[str, Any]:
    """A `subscriptions/listen` request for `uris` and the list kinds in `lists` (`toolsListChanged=True`...);
    with `uris` None the filter has no `resourceSubscriptions` field at all (a client asking for lists only)."""
    notifications: dict[str, Any] = {} if uris is None else {"resourceSubscriptions": list(uris)}
    notifications.update(lists)
    return request("subscriptions/listen", {"notifications": notifications}, request_id)


async def rpc(
    session: aiohttp.ClientSession,
    url: str,
    method: str,
    params: dict[str, Any] | None = None,
    *,
    request_id: Any = 1,
    extra_headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    """One modern request with correct headers; returns (HTTP status, JSON-RPC message)."""
    name = None
    if method in ("tools/call", "prompts/get"):
        name = (params or {}).get("name")
    elif method == "resources/read":
        name = (params or {}).get("uri")
    async with session.post(
        url, json=request(method, params, request_id), headers=headers(method, name, **(extra_headers or {}))
    ) as resp:
        return resp.status, await resp.json(content_type=None)


async def read_resource(
    session: aiohttp.ClientSession, url: str, uri: str, request_id: Any = 1, token: str | None = None
) -> dict[str, Any]:
    """One `resources/read` (as the client holding bearer `token`, if any): the JSON-RPC answer, checked to be a
    200 carrying this request's id and a result."""
    extra = {"Authorization": f"Bearer {token}"} if token else {}
    status, message = await rpc(
        session, url, "resources/read", {"uri": uri}, request_id=request_id, extra_headers=extra
    )
    assert status == 200, message
    assert message.get("id") == request_id, message
    assert "result" in message, message
    return message


def text_of(message: dict[str, Any]) -> str:
    """The text of a read's first content."""
    text: str = message["result"]["contents"][0]["text"]
    return text


async def readyz(http: aiohttp.ClientSession, base_url: str) -> tuple[int, dict[str, Any]]:
    """`GET /readyz` on a listener (the admin one says why): its status and body."""
    async with http.get(f"{base_url}/readyz") as resp:
        return resp.status, await resp.json()
