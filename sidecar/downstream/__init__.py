"""Downstream: the POST endpoint, guards, and listen streams; what the application is built from."""

from __future__ import annotations

from sidecar.downstream.handler import McpEndpoint, no_tracebacks
from sidecar.downstream.legacy import LegacySessions
from sidecar.downstream.listen import StreamHub
from sidecar.downstream.readthrough import ReadThrough
from sidecar.downstream.shared_context import ignore_authorization

__all__ = ["LegacySessions", "McpEndpoint", "ReadThrough", "StreamHub", "ignore_authorization", "no_tracebacks"]
