"""The upstream: over HTTP (`UpstreamClient`) or a stdio child process (`StdioUpstream`), both an `Upstream`."""

from __future__ import annotations

from sidecar.upstream.answers import Reply, UpstreamInfo
from sidecar.upstream.base import NotificationListener, NotificationSource, Upstream
from sidecar.upstream.http.client import UpstreamClient
from sidecar.upstream.stdio.client import StdioUpstream

__all__ = [
    "NotificationListener",
    "NotificationSource",
    "Reply",
    "StdioUpstream",
    "Upstream",
    "UpstreamClient",
    "UpstreamInfo",
]
