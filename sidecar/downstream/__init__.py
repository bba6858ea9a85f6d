"""Downstream: the POST endpoint, guards, and listen streams."""

from __future__ import annotations

__all__: list[str] = []
