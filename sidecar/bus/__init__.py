"""The buses that carry change events: in memory (one process) or Redis (replicas). Their contract is
`sidecar.changes.Bus`."""

from __future__ import annotations

from sidecar.bus.memory import MemoryBus
from sidecar.bus.redis import RedisBus, RedisUnavailable

__all__ = ["MemoryBus", "RedisBus", "RedisUnavailable"]
