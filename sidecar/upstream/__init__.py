"""The client that forwards to the upstream, and the 2025-11-25 bridge behind it."""

from __future__ import annotations

from sidecar.upstream.client import Reply, UpstreamClient, UpstreamInfo

__all__ = ["Reply", "UpstreamClient", "UpstreamInfo"]
