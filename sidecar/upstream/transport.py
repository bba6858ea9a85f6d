"""What the bridge needs of a way to reach the upstream: the `Transport` protocol, served over HTTP
(`http/transport.py`) and over a stdio child's pipes (`stdio/transport.py`), and the upstream's OAuth face
(`Protection`), which only an HTTP upstream has.

A transport moves messages: one exchange (a request and its raw answer, in the era given), a client's request
answered (whole, or as a stream of its progress), a modern client's request passed on, the upstream's own
notifications, a client session's message relayed, and its own start and close. Where the legs differ, each
says how in one member the bridge calls alike: how the era is learned (probed over HTTP, a stdio child's
handshake), how liveness is checked and told to reachability, and where an exchange's count starts (a probe over
HTTP is an exchange of its own). What the messages mean across eras (stamping, mapping errors, the `_meta` a
2026-07-28 server needs) is the bridge's.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from sidecar.identity import Identity
from sidecar.protocol import Era, JsonObject, Message, RequestId
from sidecar.upstream.answers import Reply, UpstreamInfo
from sidecar.upstream.base import Headers

__all__ = ["AnswerShaper", "Protection", "Transport", "Unprotected"]

AnswerShaper = Callable[[JsonObject], JsonObject]
"""Turns the upstream's raw answer into what the client gets (its `result` or `error`), or raises."""


class Transport(Protocol):
    """One way to the upstream: every member is one that both legs do."""

    @property
    def url(self) -> str:
        """The upstream as it may be shown."""
        ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    def drain(self, grace_s: float) -> None:
        """Shutdown has begun: requests still waiting near the end of `grace_s` are answered with an error."""
        ...

    def heard_at(self) -> float | None:
        """When the upstream last said anything (monotonic; None: not yet), for readiness's freshness."""
        ...

    async def era(self, identity: Identity, *, wait: bool = True) -> UpstreamInfo:
        """The era and capabilities as this leg learns them, told to reachability: over HTTP known, or probed
        now as `identity`; a stdio child's handshake, waited for while the child starts unless not `wait` (an
        UpstreamError at once then: readiness never waits)."""
        ...

    async def liveness(self, info: UpstreamInfo) -> None:
        """One cheap exchange in the era known, told to reachability as this leg tells it (an UpstreamError when
        the upstream does not answer)."""
        ...

    def exchanging(
        self, method: str, era: Callable[[], Awaitable[UpstreamInfo]]
    ) -> contextlib.AbstractAsyncContextManager[UpstreamInfo]:
        """One exchange of `method`, counted and timed for the block, and the era it goes in: `era` (the bridge's,
        probed when not known) before it over HTTP, where a probe is an exchange of its own; a stdio child's own
        handshake within it, where a child not ready fails the exchange."""
        ...

    async def exchange(
        self, identity: Identity, era: Era, method: str, params: JsonObject, client_headers: Headers | None = None
    ) -> JsonObject:
        """One request in `era` and its answer, as the upstream gave it (`client_headers`: a client's request)."""
        ...

    async def reply(
        self,
        identity: Identity,
        era: Era,
        method: str,
        params: JsonObject,
        request_id: RequestId | None,
        client_headers: Headers,
        shape: AnswerShaper,
    ) -> Reply:
        """A client's request in `era`, its answer shaped by `shape`: whole, or, where the leg streams a request's
        progress (a stdio child), as an SSE stream of its progress and then its answer."""
        ...

    async def pass_through(self, message: Message, client_headers: Headers, identity: Identity) -> Reply:
        """A 2026-07-28 client's request to a 2026-07-28 upstream: over HTTP as it came, and the answer as it comes;
        to a stdio child, a request on its session, the answer checked."""
        ...

    def open_stream(
        self, identity: Identity, era: Era, params: JsonObject
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[JsonObject]]:
        """The upstream's own notifications: a `subscriptions/listen` with `params` (modern), or every notification
        it sends on its own (legacy)."""
        ...

    async def relay(
        self,
        body: bytes | None,
        client_headers: Headers,
        identity: Identity,
        *,
        session_id: str | None,
        http_method: str,
    ) -> Reply:
        """A 2025-11-25 client session's message, passed through."""
        ...


class Protection(Protocol):
    """What the upstream's OAuth protection tells clients, pointed at the sidecar: its challenges and its
    protected-resource metadata (RFC 9728). Not a transport's: it moves no MCP message, and only an HTTP upstream
    has any (`http/auth.py`)."""

    def public_headers(self, headers: dict[str, str]) -> dict[str, str]:
        """Response headers for the client: an auth challenge points at the sidecar when public_url is set."""
        ...

    async def protected_resource_metadata(self, public_url: str) -> JsonObject | None:
        """The upstream's OAuth protected-resource metadata, rewritten to name `public_url`; None if it has none."""
        ...


class Unprotected:
    """An upstream nothing protects (a stdio child has no HTTP, so no OAuth): headers pass as they are, and there
    is no metadata."""

    def public_headers(self, headers: dict[str, str]) -> dict[str, str]:
        return headers

    async def protected_resource_metadata(self, public_url: str) -> JsonObject | None:
        return None
