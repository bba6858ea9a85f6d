"""A fast, minimal stdio MCP server: newline-delimited JSON-RPC on stdin/stdout, precomputed answers.

    python -m bench.fast_stdio_upstream

The stdio twin of `fast_upstream`: `server/discover` (2026-07-28) or `initialize` (2025-11-25, for a
bridge that only speaks that), then `resources/read` of any URI (`ttlMs: 0`, `cacheScope: public`,
so nothing is cached on the way), `resources/list`, `tools/list`, `ping`. One line in, one line out, at
once: what a proxy in front of it costs shows, not the server.
"""

from __future__ import annotations

import sys
from typing import Any

import orjson

__all__ = ["main"]

_DISCOVER: dict[str, Any] = {
    "resultType": "complete",
    "supportedVersions": ["2026-07-28"],
    "capabilities": {"resources": {}, "tools": {}},
    "ttlMs": 0,
    "cacheScope": "public",
    "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "bench-fast-stdio", "version": "0"}},
}
_INITIALIZE: dict[str, Any] = {
    "protocolVersion": "2025-11-25",
    "capabilities": {"resources": {}, "tools": {}},
    "serverInfo": {"name": "bench-fast-stdio", "version": "0"},
}
_EMPTY_LISTS: dict[str, dict[str, Any]] = {
    "resources/list": {"resources": [], "resultType": "complete", "ttlMs": 0, "cacheScope": "public"},
    "resources/templates/list": {"resourceTemplates": [], "resultType": "complete", "ttlMs": 0, "cacheScope": "public"},
    "tools/list": {"tools": [], "resultType": "complete", "ttlMs": 0, "cacheScope": "public"},
    "prompts/list": {"prompts": [], "resultType": "complete", "ttlMs": 0, "cacheScope": "public"},
}


def _answer(message: dict[str, Any]) -> dict[str, Any] | None:
    method = message.get("method")
    if "id" not in message or not isinstance(method, str):
        return None  # notifications and stray answers
    reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
    params = message.get("params") or {}
    if method == "resources/read":
        uri = params.get("uri", "")
        reply["result"] = {
            "contents": [{"uri": uri, "mimeType": "text/plain", "text": f"value of {uri}"}],
            "resultType": "complete",
            "ttlMs": 0,
            "cacheScope": "public",
        }
    elif method == "server/discover":
        reply["result"] = _DISCOVER
    elif method == "initialize":
        reply["result"] = _INITIALIZE
    elif method in _EMPTY_LISTS:
        reply["result"] = _EMPTY_LISTS[method]
    elif method == "ping":
        reply["result"] = {}
    else:
        reply["error"] = {"code": -32601, "message": "Method not found"}
    return reply


def main() -> None:
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        reply = _answer(message) if isinstance(message, dict) else None
        if reply is not None:
            out.write(orjson.dumps(reply) + b"\n")
            out.flush()


if __name__ == "__main__":
    main()
