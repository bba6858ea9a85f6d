"""What an upstream answer is on its way to a client, and what the probe learned of the upstream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from sidecar.protocol import ERA_REVISIONS, Era, JsonObject

__all__ = ["ByteStream", "ReleasingStream", "Reply", "UpstreamInfo", "json_object", "whole"]


@dataclass(frozen=True, slots=True)
class UpstreamInfo:
    """What the probe learned: the era to speak, and the upstream's own capabilities and identity."""

    era: Era
    capabilities: JsonObject
    server_info: JsonObject | None
    instructions: str | None

    @property
    def revision(self) -> str:
        """The protocol revision spoken upstream (`2025-11-25`, `2026-07-28`), as an operator reads it."""
        return ERA_REVISIONS[self.era]

    @classmethod
    def of(cls, era: Era, result: JsonObject, server_info: Any) -> UpstreamInfo:
        """What a `server/discover` or `initialize` result says (its fields of the wrong type left out)."""
        capabilities = result.get("capabilities")
        instructions = result.get("instructions")
        return cls(
            era=era,
            capabilities=capabilities if isinstance(capabilities, dict) else {},
            server_info=server_info if isinstance(server_info, dict) else None,
            instructions=instructions if isinstance(instructions, str) else None,
        )


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


def whole(message: JsonObject) -> Reply:
    """An answer given whole, as one JSON message."""
    return Reply(200, {"Content-Type": "application/json"}, message=message)


class ReleasingStream:
    """A live answer that calls `release` once when it ends, however it ends: read to its end, broken off, or
    closed before its first read (which an async generator's `finally` would miss)."""

    def __init__(self, stream: ByteStream, release: Callable[[], None]) -> None:
        self._stream = stream
        self._iterator = stream.__aiter__()
        self._release: Callable[[], None] | None = release

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await anext(self._iterator)
        except BaseException:
            self._done()
            raise

    async def aclose(self) -> None:
        self._done()
        await self._stream.aclose()

    def _done(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


def json_object(body: bytes | None) -> JsonObject | None:
    """The body as a JSON object, or None when it is not one."""
    try:
        decoded = orjson.loads(body or b"")
    except orjson.JSONDecodeError:
        return None
    return decoded if isinstance(decoded, dict) else None
