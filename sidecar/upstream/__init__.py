"""The upstream: one era bridge (`UpstreamBridge`) over HTTP (`UpstreamClient`) or a stdio child process
(`StdioUpstream`); consumers hold it as the small roles of `base.py` (`Upstream` is all of them)."""

from __future__ import annotations

from sidecar.upstream.answers import Reply, UpstreamInfo
from sidecar.upstream.base import NotificationListener, NotificationSource, Upstream
from sidecar.upstream.bridge import UpstreamBridge
from sidecar.upstream.http.client import UpstreamClient
from sidecar.upstream.standing import announce_upstream
from sidecar.upstream.stdio.client import StdioUpstream

__all__ = [
    "NotificationListener",
    "NotificationSource",
    "Reply",
    "StdioUpstream",
    "Upstream",
    "UpstreamBridge",
    "UpstreamClient",
    "UpstreamInfo",
    "announce_upstream",
]
