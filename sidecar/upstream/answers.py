"""What an upstream answer is on its way to a client, and what the probe learned of the upstream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from sidecar.protocol.envelope import Era

__all__ = ["ByteStream", "Reply", "UpstreamInfo"]

JsonObject = dict[str, Any]


@dataclass(frozen=True, slots=True)
class UpstreamInfo:
    """What the probe learned: the era to speak, and the upstream's own capabilities and identity."""

    era: Era
    capabilities: JsonObject
    server_info: JsonObject | None
    instructions: str | None


class ByteStream(Protocol):
    """A live answer's bytes, as they arrive; `aclose` ends it (and is safe before the first read)."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


@dataclass(slots=True)
class Reply:
    """An upstream answer on its way to the client: a whole JSON message, raw bytes, or a live stream."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    message: JsonObject | None = None
    body: bytes | None = None
    stream: ByteStream | None = None
