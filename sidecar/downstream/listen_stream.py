"""A listen stream's own rules, as a plain object: its pending signals, what it writes and when, its end frame.

It never awaits and owns no socket (hypercorn's cut between a protocol and its server): it writes through a
`Writer` (the SSE response, or a test's recording fake) and says, from `step`, what its driver must wait for next.
The driver (`StreamHub` in `listen.py`) does the waiting on a `ClientConnection` (a `Writer` it can also drain):
for room in the send buffer, or for the next signal. The hub delivers to it, as to a 2025-11-25 session, as a
`SignalSink`.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import orjson

from sidecar.downstream.pending import PendingSignals
from sidecar.protocol import complete_result, notification

if TYPE_CHECKING:
    import asyncio

    from sidecar.changes import WatchKey
    from sidecar.observability.metrics import Metrics
    from sidecar.protocol import RequestId
    from sidecar.watch.handles import Handle

__all__ = ["ClientConnection", "ListenStream", "SignalSink", "Step", "Writer", "frame_around_id"]

_ENDED = {"moved": {"reason": "upstream_unreachable", "retryable": True}}
"""What the complete result says of an end the client should act on: this replica cannot reach the upstream and
another can, so listen again (through the load balancer) and re-read."""

_ID_SLOT = "\x00"
_ID_SLOT_JSON = b'"\\u0000"'


@functools.lru_cache(maxsize=256)
def frame_around_id(method: str, uri: str | None) -> tuple[bytes, bytes]:
    """A notification's JSON before and after its subscription id: the same for every stream a change reaches,
    so a fan-out encodes it once, not once per stream. The slot is the first string that JSON-escapes to
    `"\\u0000"`: `_meta` (and the id in it) comes before the URI, and a method name holds no NUL."""
    before, slot, after = orjson.dumps(notification(_ID_SLOT, method, uri)).partition(_ID_SLOT_JSON)
    assert slot, "the id slot is in the frame"
    return before, after


class Writer(Protocol):
    """Where a stream's frames go: `EventStream` on a real connection."""

    quiet: bool
    """Nothing written since the keep-alive ticker last looked (the writer clears it on every write)."""

    @property
    def writable(self) -> bool: ...

    @property
    def connected(self) -> bool: ...

    def write_event(self, data: bytes) -> None: ...

    def write_comment(self) -> None: ...


class ClientConnection(Writer, Protocol):
    """A listen stream's connection: `EventStream` on a socket (so the hub's rules are tested without one)."""

    async def open(self) -> None: ...

    async def drain(self) -> None: ...

    async def close(self) -> None: ...


class Step(enum.Enum):
    """What a stream's driver does next."""

    DRAIN = "drain"
    """Signals are pending and the send buffer is full: wait until the client has read some."""
    WAIT = "wait"
    """Nothing to write: wait until `waiter` is woken (a signal that did not fit, or the close)."""
    DONE = "done"
    """The end frame is written, or the client is gone: the stream is over."""


class SignalSink(Protocol):
    """Something the hub delivers change signals to: a listen stream, or a legacy session."""

    @property
    def handles(self) -> list[Handle]: ...

    def signal(self, method: str, uri: str | None, detected_at: float) -> None: ...

    def close(self, reason: str) -> None: ...

    def revoke(self, key: WatchKey) -> list[Handle]:
        """Its context was refused `key` upstream: stop delivering it; returns the handles to release now."""
        ...


class ListenStream:
    """One listen request: a pending set of signals keyed by (method, uri), never a queue (invariant 11).

    Signals are written straight into the connection's send buffer by the hub's fan-out while it has room;
    what does not fit stays pending (merging with later signals for the same key) for the stream's driver,
    which awaits the slow client.
    """

    __slots__ = (
        "_closing",
        "_on_pending",
        "_on_written",
        "_pending",
        "_writer",
        "end_reason",
        "ended",
        "handles",
        "subscription_id",
        "waiter",
    )

    def __init__(
        self,
        subscription_id: RequestId,
        metrics: Metrics,
        on_pending: Callable[[ListenStream], None],
        on_written: Callable[[str, float], None],
    ) -> None:
        self.subscription_id = subscription_id
        self.handles: list[Handle] = []
        self.end_reason = "client"
        self.ended = False
        self.waiter: asyncio.Future[None] | None = None
        """Set by the driver while it waits for work (an asyncio.Event would keep a deque per stream for ever)."""
        self._on_pending = on_pending
        self._on_written = on_written
        self._pending = PendingSignals(metrics.coalesced)
        self._closing = False
        self._writer: Writer | None = None
        """Set from the ack until the end: only then may signals be written."""

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def signal(self, method: str, uri: str | None, detected_at: float) -> None:
        """Called by the bus fan-out; synchronous, never raises. A second signal before a write merges."""
        if self._pending.add(method, uri, detected_at):
            self._on_pending(self)

    def revoke(self, key: WatchKey) -> list[Handle]:
        """A refused credential ends the whole stream, so the client re-authenticates and listens again."""
        self.close("auth")
        return []

    def close(self, reason: str) -> None:
        """Start a graceful end: pending signals flush, then the complete result, then the stream closes."""
        self._closing = True
        self.end_reason = reason
        self._wake()

    def begin(self, writer: Writer) -> None:
        """The ack is written: from now on signals go to `writer`."""
        self._writer = writer

    def finish(self) -> None:
        """The driver is done with the stream: nothing more is written, whoever calls."""
        self._writer = None

    def flush(self) -> None:
        """Write pending signals while the send buffer has room; wake the driver for the rest."""
        writer = self._writer
        if writer is None:
            return  # not acknowledged yet: the driver writes them after the ack
        pending = self._pending
        while pending and writer.writable:
            key = next(iter(pending))
            detected_at = pending.pop(key)
            before, after = frame_around_id(*key)
            writer.write_event(before + orjson.dumps(self.subscription_id) + after)
            self._on_written(key[0], detected_at)
        if pending:
            self._wake()

    def step(self) -> Step:
        """Write what fits, then say what to wait for; once closed and drained, the end frame (invariant 13)."""
        writer = self._writer
        assert writer is not None, "step() between begin() and finish()"
        self.flush()
        if not writer.connected:
            return Step.DONE
        if self._pending:
            return Step.DRAIN
        if self._closing:
            writer.write_event(orjson.dumps(complete_result(self.subscription_id, _ENDED.get(self.end_reason))))
            return Step.DONE
        return Step.WAIT

    def keepalive(self) -> bool:
        """The shared ticker's visit: a comment if nothing was written since the last one (invariant 12)."""
        writer = self._writer
        if writer is None:
            return False
        wrote = writer.quiet and writer.writable
        if wrote:
            writer.write_comment()
        writer.quiet = True
        return wrote

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
