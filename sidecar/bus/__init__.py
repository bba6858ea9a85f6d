"""Change events and the buses that carry them: in memory (one process) or Redis (replicas)."""

from __future__ import annotations

from sidecar.bus.base import Bus, ChangeEvent, ChangeListener
from sidecar.bus.memory import MemoryBus

__all__ = ["Bus", "ChangeEvent", "ChangeListener", "MemoryBus"]
