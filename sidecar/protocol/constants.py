"""Every wire constant the sidecar uses: protocol versions, `_meta` keys, header and method names."""

from __future__ import annotations

__all__ = [
    "ACK_METHOD",
    "CACHEABLE_METHODS",
    "HANDSHAKE_VERSIONS",
    "HEADER_ACCEPT",
    "HEADER_AUTHORIZATION",
    "HEADER_METHOD",
    "HEADER_NAME",
    "HEADER_PARAM_PREFIX",
    "HEADER_PROTOCOL_VERSION",
    "HEADER_SESSION_ID",
    "LEGACY_VERSION",
    "META_CLIENT_CAPABILITIES",
    "META_CLIENT_INFO",
    "META_ENDED",
    "META_LEFT_OUT",
    "META_LOG_LEVEL",
    "META_PROTOCOL_VERSION",
    "META_SERVER_INFO",
    "META_SUBSCRIPTION_ID",
    "META_UPSTREAM_SERVER_INFO",
    "MODERN_VERSION",
    "NAMED_METHODS",
    "READ_ONLY_METHODS",
    "REMOVED_METHODS",
    "RESOURCE_UPDATED_METHOD",
    "SUPPORTED_MODERN_VERSIONS",
]

MODERN_VERSION = "2026-07-28"
"""The protocol revision the sidecar serves to modern clients."""

SUPPORTED_MODERN_VERSIONS: tuple[str, ...] = (MODERN_VERSION,)
"""Modern versions accepted downstream; anything else is -32022."""

LEGACY_VERSION = "2025-11-25"
"""The handshake-era revision the sidecar speaks to legacy upstreams."""

HANDSHAKE_VERSIONS: frozenset[str] = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"})
"""Versions negotiated with `initialize`; a header carrying one of these means the legacy era."""

META_PROTOCOL_VERSION = "io.modelcontextprotocol/protocolVersion"
"""Request `_meta` key: the modern protocol version (required)."""

META_CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
"""Request `_meta` key: the client's capabilities for this request (required)."""

META_CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
"""Request `_meta` key: client name and version (optional)."""

META_LOG_LEVEL = "io.modelcontextprotocol/logLevel"
"""Request `_meta` key: opts in to `notifications/message` for one request (deprecated)."""

META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"
"""Result `_meta` key: who answered."""

META_SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
"""Notification `_meta` key: the id of the `subscriptions/listen` request a frame belongs to."""

META_UPSTREAM_SERVER_INFO = "io.github.mcp-sidecar/upstreamServerInfo"
"""Our own result `_meta` key on `server/discover`: the upstream's serverInfo."""

META_CACHED = "io.github.mcp-sidecar/cached"
"""Our own result `_meta` key on `server/discover`: true when the upstream could not be reached and the answer is
the last one this client's context was given (so a client can connect, and listen, during an outage)."""

META_ENDED = "io.github.mcp-sidecar/ended"
"""Our own `_meta` key on a listen's complete result when the sidecar ended it for a reason the client should act on:
`{"reason": "upstream_unreachable", "retryable": true}` (listen again through the load balancer: this replica cannot
reach the upstream and another can)."""

META_LEFT_OUT = "io.github.mcp-sidecar/leftOut"
"""Our own `_meta` key on a listen's ack: what the ack leaves out of the filter, each with the JSON-RPC error
code and message that say why (absent when nothing was left out)."""

HEADER_PROTOCOL_VERSION = "MCP-Protocol-Version"
HEADER_METHOD = "Mcp-Method"
HEADER_NAME = "Mcp-Name"
HEADER_PARAM_PREFIX = "Mcp-Param-"
HEADER_SESSION_ID = "Mcp-Session-Id"
HEADER_AUTHORIZATION = "Authorization"
HEADER_ACCEPT = "Accept"

NAMED_METHODS: dict[str, str] = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
"""Methods whose `Mcp-Name` header mirrors a body parameter, and which parameter."""

REMOVED_METHODS: frozenset[str] = frozenset(
    {
        "initialize",
        "ping",
        "logging/setLevel",
        "resources/subscribe",
        "resources/unsubscribe",
    }
)
"""Legacy methods a modern envelope must get 404 -32601 for."""

CACHEABLE_METHODS: frozenset[str] = frozenset(
    {
        "server/discover",
        "tools/list",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
        "resources/read",
    }
)
"""Results that carry `ttlMs` and `cacheScope` at 2026-07-28."""

READ_ONLY_METHODS: frozenset[str] = frozenset(
    {
        *CACHEABLE_METHODS,
        *REMOVED_METHODS,
        "prompts/get",
        "completion/complete",
        "subscriptions/listen",
    }
)
"""Requests that change nothing upstream. Any other request (`tools/call`, a task, a custom method) may write,
so watches revalidate after it; notifications never do."""

ACK_METHOD = "notifications/subscriptions/acknowledged"
RESOURCE_UPDATED_METHOD = "notifications/resources/updated"
"""Each list kind's notification is in `sidecar.protocol.lists`, with the rest of what describes it."""
