"""mcp-sidecar: a reverse proxy that gives MCP resource subscriptions to servers that lack them."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
