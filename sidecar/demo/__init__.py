"""The embedded demo: a legacy upstream without subscriptions, and the sidecar in front of it."""

from __future__ import annotations

__all__: list[str] = []
