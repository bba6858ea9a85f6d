"""The one era bridge: probing, forwarding, the sidecar's own calls, the 2025-11-25 translation and stamping, and
the upstream's notification stream, over whichever transport reaches the upstream (HTTP or a stdio child).

A 2026-07-28 client's request to a 2025-11-25 upstream loses the modern `_meta` keys, and its answer is
stamped (`resultType`, `ttlMs`, `cacheScope`) or its error mapped (protocol.md section 5); to a 2026-07-28
upstream over HTTP it passes as it came. The sidecar's own requests carry the `_meta` a 2026-07-28 upstream
needs. Every exchange is counted and timed by one `Reachability`, which also holds whether the upstream can be
used now. `UpstreamClient` and `StdioUpstream` are this class wired to one transport each.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from functools import partial

from cachetools import LRUCache

from sidecar.config import CacheConfig
from sidecar.identity import ANONYMOUS_IDENTITY, Identity
from sidecar.protocol import JsonObject, Message, UpstreamError
from sidecar.upstream.answers import Reply, UpstreamInfo
from sidecar.upstream.base import Headers
from sidecar.upstream.era import checked, own_request_params, result_of, strip_modern_meta, translated
from sidecar.upstream.reachability import Reachability
from sidecar.upstream.transport import Protection, Transport, Unprotected

__all__ = ["UpstreamBridge"]


_REMEMBERED_CONTEXTS = 10_000
"""Contexts whose last discovery is kept for an outage (least recently used go first: theirs fails as it did)."""


class UpstreamBridge:
    """The upstream as the sidecar uses it (every role of `sidecar.upstream.base`), in whichever era it speaks."""

    def __init__(
        self,
        transport: Transport,
        reachability: Reachability,
        cache: CacheConfig,
        protection: Protection | None = None,
    ) -> None:
        self._transport = transport
        self._protection: Protection = protection or Unprotected()
        self._reach = reachability
        self._cache = cache
        self._discovered: LRUCache[str, UpstreamInfo] = LRUCache(maxsize=_REMEMBERED_CONTEXTS)
        """The last era and capabilities each context was given: a client connecting during an outage gets them
        (per context, so what one credential was told never reaches another)."""

    # -- health -------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._reach.url

    @property
    def info(self) -> UpstreamInfo | None:
        return self._reach.info

    @property
    def up(self) -> bool | None:
        return self._reach.up

    @property
    def last_error(self) -> str | None:
        return self._reach.last_error

    @property
    def unusable(self) -> str | None:
        return self._reach.unusable

    @property
    def not_ready_reason(self) -> str | None:
        return self._reach.not_ready_reason

    @property
    def retry_in_s(self) -> float | None:
        return self._reach.retry_in_s

    def add_recovery_listener(self, listener: Callable[[], None]) -> Callable[[], None]:
        return self._reach.add_recovery_listener(listener)

    async def reached(self) -> UpstreamInfo:
        return await self._reach.reached()

    async def check(self) -> bool:
        """Readiness: the era is known and the upstream was heard from lately; without recent contact it is
        asked again (an upstream whose era is not known yet is probed, a stdio child's handshake is not waited for)."""
        stale = self._reach.up is not False and self._reach.stale(self._transport.heard_at())
        with contextlib.suppress(UpstreamError):
            if self._reach.info is None or stale:
                await self._ask_now()
        return self._reach.not_ready_reason is None

    async def answers_now(self) -> bool:
        """One exchange with the upstream now: a probe while the era is not known, else a liveness check."""
        with contextlib.suppress(UpstreamError):
            await self._ask_now()
            return self._reach.not_ready_reason is None
        return False

    async def _ask_now(self) -> None:
        # One exchange with the upstream now (also what reachability retries while an HTTP upstream is down): a
        # probe while the era is not known (a stdio child not answering its handshake yet fails it at once), else
        # a liveness check in the era known.
        info = self._reach.info
        if info is None:
            await self.ensure_info(wait=False)
        else:
            await self._transport.liveness(info)

    # -- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        await self._transport.start()

    async def aclose(self) -> None:
        self._reach.stop_retrying()
        await self._transport.aclose()

    def drain(self, grace_s: float) -> None:
        self._transport.drain(grace_s)

    # -- the era ------------------------------------------------------------------------------------------

    async def discovery(self, identity: Identity = ANONYMOUS_IDENTITY) -> tuple[UpstreamInfo, bool]:
        """What a client of `identity`'s context connects with (`server/discover`, a listen's capabilities): the
        era and capabilities now (False), or, while the upstream cannot be reached, the last ones that context was
        given (True: remembered), so a client can connect and listen during an outage; with none, the failure."""
        try:
            return await self.ensure_info(identity), False
        except UpstreamError as exc:
            remembered = self._discovered.get(identity.context)
            if remembered is None or not exc.is_transport_failure:
                raise
            return remembered, True

    async def ensure_info(self, identity: Identity = ANONYMOUS_IDENTITY, *, wait: bool = True) -> UpstreamInfo:
        """The era and capabilities: probed once (again after a failure) as `identity`, since a protected upstream
        refuses an anonymous probe; or, for a stdio child, its handshake (waiting while it starts, unless not
        `wait`)."""
        info = await self._transport.era(identity, wait=wait)
        if self._discovered.get(identity.context) is not info:
            self._discovered[identity.context] = info
        return info

    # -- forwarding ---------------------------------------------------------------------------------------

    async def forward(self, message: Message, client_headers: Headers, identity: Identity) -> Reply:
        """A modern client's request, answered in the client's era."""
        async with self._transport.exchanging(message.method, partial(self.ensure_info, identity)) as info:
            if info.era == "modern":
                return await self._transport.pass_through(message, client_headers, identity)
            params = strip_modern_meta(message.params)
            shape = partial(translated, self.url, self._cache, message.method, message.params)
            return await self._transport.reply(
                identity, info.era, message.method, params, message.id, client_headers, shape
            )

    async def relay(
        self,
        body: bytes | None,
        client_headers: Headers,
        identity: Identity,
        *,
        session_id: str | None = None,
        http_method: str = "POST",
    ) -> Reply:
        """A 2025-11-25 client session's message, on the upstream session `session_id` (the upstream's own id;
        None: `initialize`)."""
        return await self._transport.relay(
            body, client_headers, identity, session_id=session_id, http_method=http_method
        )

    def public_headers(self, headers: dict[str, str]) -> dict[str, str]:
        """Response headers for the client: an auth challenge points at the sidecar when public_url is set."""
        return self._protection.public_headers(headers)

    async def protected_resource_metadata(self, public_url: str) -> JsonObject | None:
        """The upstream's OAuth protected-resource metadata, rewritten to name `public_url`; None if it has none."""
        return await self._protection.protected_resource_metadata(public_url)

    # -- the sidecar's own calls --------------------------------------------------------------------------

    async def call(self, method: str, params: JsonObject, identity: Identity = ANONYMOUS_IDENTITY) -> JsonObject:
        """One request on the sidecar's behalf (a poll), for `identity`; the result, or an UpstreamError."""
        async with self._transport.exchanging(method, partial(self.ensure_info, identity)) as info:
            if info.era == "modern":
                sent = own_request_params(params)
                answer = checked(self.url, await self._transport.exchange(identity, "modern", method, sent))
            else:
                raw = await self._transport.exchange(identity, "legacy", method, params)
                answer = translated(self.url, self._cache, method, params, raw)
            return result_of(self.url, answer)

    @contextlib.asynccontextmanager
    async def open_notifications(
        self, identity: Identity, wanted: JsonObject
    ) -> AsyncIterator[AsyncIterator[JsonObject]]:
        """The upstream's own notifications for one authorization context, held open for the block: against a
        2026-07-28 upstream, a `subscriptions/listen` with the filter `wanted` (its first message is the ack);
        against a 2025-11-25 one, every notification it sends on its own (the caller subscribes to URIs with
        `call("resources/subscribe", ...)`, on the same upstream session)."""
        info = await self.ensure_info(identity)
        params = own_request_params({"notifications": wanted}) if info.era == "modern" else {}
        async with self._transport.open_stream(identity, info.era, params) as messages:
            yield messages
