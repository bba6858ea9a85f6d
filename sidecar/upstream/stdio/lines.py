"""Newline-delimited framing for a child's pipes: lines of bounded length; logs that count what they hold back.

A line longer than the bound is never held in memory whole: it comes out as an `OverlongLine` that
keeps only its first and last bytes, enough to find the JSON-RPC id of an answer too large to take
(SDKs write the id near the start, `{"jsonrpc":"2.0","id":7,...`, or near the end, `...,"id":7}`).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field

__all__ = ["LineSplitter", "OverlongLine", "RateLimitedLog", "TokenBucket"]

_KEPT_BYTES = 256
_ID = re.compile(rb'"id"\s*:\s*(-?\d+)\s*[,}]')


@dataclass(slots=True)
class OverlongLine:
    """A line over the bound: its size and its first and last bytes only."""

    head: bytes
    tail: bytes = b""
    size: int = 0

    def extend(self, piece: bytes) -> None:
        self.size += len(piece)
        self.tail = (self.tail + piece)[-_KEPT_BYTES:]

    def find_id(self) -> int | None:
        """The integer id of the JSON-RPC message, when its head or tail shows one."""
        for part in (self.head, self.tail):
            match = _ID.search(part)
            if match is not None:
                return int(match.group(1))
        return None


@dataclass(slots=True)
class LineSplitter:
    """Cuts a byte stream into lines (without their newline) of at most `limit` bytes."""

    limit: int
    _buffer: bytearray = field(default_factory=bytearray)
    _overlong: OverlongLine | None = None

    def feed(self, chunk: bytes) -> list[bytes | OverlongLine]:
        lines: list[bytes | OverlongLine] = []
        start = 0
        while start < len(chunk):
            newline = chunk.find(b"\n", start)
            piece = chunk[start:] if newline < 0 else chunk[start:newline]
            if self._overlong is not None:
                self._overlong.extend(piece)
            else:
                self._buffer += piece
                if len(self._buffer) > self.limit:
                    self._overlong = OverlongLine(bytes(self._buffer[:_KEPT_BYTES]))
                    self._overlong.extend(bytes(self._buffer))
                    self._buffer.clear()
            if newline < 0:
                break
            if self._overlong is not None:
                lines.append(self._overlong)
                self._overlong = None
            else:
                lines.append(bytes(self._buffer))
                self._buffer.clear()
            start = newline + 1
        return lines


class RateLimitedLog:
    """One warning per interval at most; what it holds back in between is counted and reported with the next."""

    def __init__(self, logger: logging.Logger, message: str, interval_s: float = 10.0) -> None:
        self._logger = logger
        self._message = message
        self._interval_s = interval_s
        self._last = -interval_s
        self._held = 0

    def log(self, sample: str) -> None:
        """Warn with `sample` (one of the lines), or count it when a warning went out within the interval."""
        now = time.monotonic()
        if now - self._last < self._interval_s:
            self._held += 1
            return
        self._last = now
        self._logger.warning(self._message, extra={"sample": sample, "held_back": self._held})
        self._held = 0

    def count(self) -> None:
        """One more line held back, to be reported by `flush`."""
        self._held += 1

    def flush(self) -> None:
        if self._held:
            self._logger.warning(self._message, extra={"lines": self._held})
            self._held = 0


class TokenBucket:
    """`rate` events per second on average, in bursts of up to ten seconds' worth; rate 0 allows none."""

    def __init__(self, rate: float) -> None:
        self._rate = rate
        self._capacity = max(rate * 10, 1.0) if rate > 0 else 0.0
        self._tokens = self._capacity
        self._last = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self._capacity, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False
