"""The watch engine, sans I/O: events in, commands out (`Engine.handle(event, now)`), and nothing awaited.

The registry (`sidecar.watch.registry`) is its one driver. As in mitmproxy's proxy core, the rules live where no
socket, task or timer can interleave with them, and their tests are playbooks: feed events, expect commands.
"""

from __future__ import annotations

from sidecar.watch.engine.core import Engine
from sidecar.watch.engine.record import Record, Stage

__all__ = ["Engine", "Record", "Stage"]
