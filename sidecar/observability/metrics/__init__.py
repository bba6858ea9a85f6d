"""Prometheus metrics; the only package that imports prometheus_client. Labels come from small fixed sets.

`Metrics` (registry.py) holds every family of one sidecar; each sibling module defines the families of one area,
with their label values from `labels.py`.
"""

from __future__ import annotations

from sidecar.observability.metrics.batch import ObservationBatch
from sidecar.observability.metrics.labels import HINT_OUTCOMES, TOOL_CALL_DECISIONS
from sidecar.observability.metrics.registry import CONTENT_TYPE_LATEST, Metrics
from sidecar.observability.metrics.requests import method_label

__all__ = ["CONTENT_TYPE_LATEST", "HINT_OUTCOMES", "TOOL_CALL_DECISIONS", "Metrics", "ObservationBatch", "method_label"]
