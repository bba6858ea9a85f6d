"""Hints from the source of truth: `POST /hints` on the admin listener, its bearer token, and the client
command (`mcp-sidecar hint`)."""

from __future__ import annotations

from sidecar.hints.endpoint import MAX_BODY_BYTES, MAX_GLOBS, HintEndpoint
from sidecar.hints.token import HintToken

__all__ = ["MAX_BODY_BYTES", "MAX_GLOBS", "HintEndpoint", "HintToken"]
