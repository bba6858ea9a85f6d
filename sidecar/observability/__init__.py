"""Metrics, structured logs and health endpoints."""

from __future__ import annotations

from sidecar.observability.logs import configure_logging
from sidecar.observability.metrics import Metrics

__all__ = ["Metrics", "configure_logging"]
