"""The upstream reached over HTTP: `UpstreamClient`, on a keep-alive wire of its own (`wire`, `connection`), with
the 2025-11-25 session bridge (`legacy`) and the auth pass-through (`auth`)."""

from __future__ import annotations

from sidecar.upstream.http.client import UpstreamClient

__all__ = ["UpstreamClient"]
