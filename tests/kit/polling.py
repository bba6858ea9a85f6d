"""Polling configurations the invariant pins share, each named for what it leaves to happen."""

from __future__ import annotations

__all__ = ["FAST", "QUICK_COMMENTS", "SLOW"]

SLOW = {"default_interval_ms": 60_000, "max_interval_ms": 60_000, "min_interval_ms": 50, "linger_ms": 60_000}
"""Nobody's poll comes in time, and a watch nobody holds lingers: only a subscription's own look (a listen's, a
subscribe's, a joiner's) or a write's hint can make a read fresh."""
QUICK_COMMENTS = {"keepalive_s": 0.2}
"""A quiet stream hears a comment every 0.2 s: the marks that a whole quiet interval went by."""
FAST = {"min_interval_ms": 100, "default_interval_ms": 300, "max_interval_ms": 300}
"""Polls every 0.3 s (with jitter), so a change is seen within a test's patience without any hint."""
