"""No re-read stampede: identical cacheable requests share one upstream request, and fresh results are reused.

Keys are (method, the parameters that affect the result, context): `public`, or the authorization
context for private or unknown scope. A change published on the bus drops the cached entries of its
key and makes requests already in flight for it unjoinable, before any notification is sent (the
cache subscribes to the bus before the streams do), so a client that re-reads after `updated` gets a
request that started after the change.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import orjson
from cachetools import LRUCache, TLRUCache

from sidecar.changes import ChangeEvent, EventRouting, WatchKey, WatchKind
from sidecar.config import CacheConfig
from sidecar.identity import PUBLIC
from sidecar.observability.metrics import Metrics
from sidecar.protocol import CACHEABLE_METHODS, LIST_KIND_OF_METHOD, LIST_KINDS, JsonObject
from sidecar.upstream.answers import Reply
from sidecar.watch.fingerprint import fingerprint_contents

__all__ = ["ReadThrough", "is_shareable"]

logger = logging.getLogger(__name__)

Group = tuple[str, str | None]
"""(method, uri): what a change invalidates; lists use uri None."""
CacheKey = tuple[str, bytes, str]

_KINDS: dict[str, WatchKind] = {"resources/read": "resource", **LIST_KIND_OF_METHOD}
"""The watch kind whose changes drop a cached answer of each method (others are never dropped by a change)."""
_MRTR_PARAMS = ("inputResponses", "requestState")
_INDEX_PRUNE_EVERY = 1024
_MAX_OBSERVATIONS = 100_000
"""Watches' latest looks remembered (one per watched key and context; least recently used go first)."""
_MAX_VERIFIED = 4096
"""Contexts remembered per public entry; past that, a new context's first read goes upstream (and is answered)."""


def is_shareable(method: str, params: JsonObject) -> bool:
    """Cacheable methods, except MRTR retries and requests that asked for progress (a stream of their own)."""
    if method not in CACHEABLE_METHODS or any(name in params for name in _MRTR_PARAMS):
        return False
    meta = params.get("_meta")
    return not (isinstance(meta, dict) and "progressToken" in meta)


def _params_key(params: JsonObject) -> bytes:
    # The common read, {"uri": ..., "_meta": ...}: the URI itself. JSON text always starts with "{", so a key that
    # starts with "u" can never equal one of the serialised keys below.
    if len(params) <= 2:
        uri = params.get("uri")
        if isinstance(uri, str) and len(params) == 1 + ("_meta" in params) and uri.isascii():
            return b"u" + uri.encode("ascii")
    try:
        return orjson.dumps({k: v for k, v in params.items() if k != "_meta"}, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        # Parameters nested deeper than orjson writes: a key of its own, so the request is never shared.
        return b"\0" + secrets.token_bytes(16)


def _groups_of(key: WatchKey) -> tuple[Group, ...]:
    if key.kind == "resource":
        return (("resources/read", key.uri),)
    return tuple((listed.method, None) for listed in LIST_KINDS[key.kind].methods)


def _differs(group: Group, result: JsonObject, fingerprint: str) -> bool:
    if group[0] != "resources/read":
        return True
    try:
        return fingerprint_contents(result.get("contents")) != fingerprint
    except ValueError:
        return True


def _group(method: str, params: JsonObject) -> Group:
    uri = params.get("uri") if method == "resources/read" else None
    return (method, uri if isinstance(uri, str) else None)


@dataclass(slots=True)
class _Entry:
    result: JsonObject
    expires_at: float
    size: int
    verified: set[str] = field(default_factory=set)
    """For a public entry: the contexts the upstream has answered for this request (they may be served it)."""
    ticket: int = 0
    """When the request that brought it started, on the watch engine's clock (see WatchRegistry.ticket)."""


class _EntryCache(TLRUCache[CacheKey, _Entry]):
    """cachetools' time-aware LRU, bounded by bytes, counting what it evicts to stay in bounds."""

    on_evict: Callable[[], None] = staticmethod(lambda: None)

    def popitem(self) -> tuple[CacheKey, _Entry]:
        item = super().popitem()
        self.on_evict()
        return item


_FlightKey = tuple[str, bytes, str] | tuple[str, bytes, str, str]


@dataclass(slots=True)
class _Flight:
    future: asyncio.Future[JsonObject | None]
    group: Group
    key: _FlightKey
    """Where it is listed: (method, params, context) once upstream, with the client appended before."""
    invalidated: bool = False


class ReadThrough:
    """The single-flight table and the response cache, both bounded."""

    def __init__(
        self,
        config: CacheConfig,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        routing: EventRouting | None = None,
    ) -> None:
        self._config = config
        self._routing = routing
        """Replicas: an entry is kept only while this process hears its changes (the bus routes by interest)."""
        self._metrics = metrics
        self._clock = clock
        self._cache = _EntryCache(
            maxsize=max(config.max_bytes, 1),
            ttu=lambda _key, entry, _now: entry.expires_at,
            timer=clock,
            getsizeof=lambda entry: entry.size,
        )
        self._cache.on_evict = metrics.cache_evictions.inc
        self._verify = config.public_requires_verified_context
        self._flights: dict[_FlightKey, _Flight] = {}
        self._flights_of: dict[str, dict[str | None, dict[_FlightKey, _Flight]]] = {}
        """The same flights by method, then URI: a change wakes only its own (a list's change every URI of its
        method), without a pass over every request in flight."""
        self._latest: LRUCache[tuple[Group, str], tuple[int, str, int]] = LRUCache(maxsize=_MAX_OBSERVATIONS)
        """(group, context) -> the (ticket, fingerprint) of the latest look a watch applied, and the ticket of the
        first of the looks in a row, up to it, that saw that same fingerprint."""
        self._index: dict[Group, dict[str, set[CacheKey]]] = {}
        """group -> entry context -> keys: a look touches only its own context's entries, however many contexts
        share the group (every context's list sits in one group). Lags expiry and eviction until pruned."""
        self._inserts = 0

    # -- cache -----------------------------------------------------------------------------------------

    def lookup(self, method: str, params: JsonObject, context: str) -> JsonObject | None:
        """A fresh cached result: the public entry, else this context's own."""
        if not self._config.max_entries:
            return None
        if not self._cache:  # nothing cached (an upstream that answers ttlMs 0): no key to build, nothing to expire
            self._metrics.cache_misses.inc()
            return None
        params_key = _params_key(params)
        for entry_context in (PUBLIC, context):
            entry = self._cache.get((method, params_key, entry_context))
            if entry is not None and entry_context == PUBLIC and context not in entry.verified and self._verify:
                continue  # the upstream has not answered this context yet: it may refuse it
            if entry is not None:
                self._metrics.cache_hits.inc()
                result = dict(entry.result)
                remaining_ms = int((entry.expires_at - self._clock()) * 1000)
                result["ttlMs"] = max(remaining_ms, 0)  # what is left of the freshness the upstream granted
                return result
        self._metrics.cache_misses.inc()
        return None

    def _store(
        self,
        method: str,
        params: JsonObject,
        context: str,
        result: JsonObject,
        received_at: float,
        ticket: int,
        started: float,
    ) -> None:
        ttl = result.get("ttlMs")
        if not self._config.max_entries or not isinstance(ttl, int) or isinstance(ttl, bool) or ttl <= 0:
            return
        if result.get("resultType", "complete") != "complete":
            return
        entry_context = PUBLIC if result.get("cacheScope") == "public" else context
        try:
            size = len(orjson.dumps(result))
        except TypeError:  # nested deeper than orjson writes: not cached, still answered
            return
        if size > self._config.max_bytes:
            return
        group = _group(method, params)
        if self._contradicted(group, entry_context, result, ticket):
            return  # a watch has since seen something else: this answer is already stale
        kind = _KINDS.get(method)
        if self._routing is not None and kind is not None:
            if not self._routing.hold(kind, group[1], started, received_at + ttl / 1000):
                return  # a change since the request started might not have reached us: kept from the next one
        key = (method, _params_key(params), entry_context)
        while len(self._cache) >= self._config.max_entries and key not in self._cache:
            self._cache.popitem()
        previous = self._cache.get(key)
        verified = previous.verified if previous is not None else set()
        if entry_context == PUBLIC and len(verified) < _MAX_VERIFIED:
            verified.add(context)
        self._cache[key] = _Entry(result, received_at + ttl / 1000, size, verified, ticket)
        self._index.setdefault(group, {}).setdefault(entry_context, set()).add(key)
        self._metrics.cache_bytes.set(self._cache.currsize)
        self._inserts += 1
        if self._inserts % _INDEX_PRUNE_EVERY == 0:
            self._prune_index()

    def _prune_index(self) -> None:
        # Entries also leave by expiry and eviction, which the index does not see; drop what is gone.
        for group, by_context in list(self._index.items()):
            for context, keys in list(by_context.items()):
                alive = {key for key in keys if key in self._cache}
                if alive:
                    by_context[context] = alive
                else:
                    del by_context[context]
            if not by_context:
                del self._index[group]

    def _drop(self, group: Group, cache_key: CacheKey) -> None:
        self._cache.pop(cache_key, None)
        by_context = self._index.get(group)
        keys = by_context.get(cache_key[2]) if by_context is not None else None
        if by_context is None or keys is None:
            return
        keys.discard(cache_key)
        if not keys:  # nothing left behind for a context or group that comes and goes
            del by_context[cache_key[2]]
            if not by_context:
                del self._index[group]

    def _keys_of(self, group: Group, context: str) -> list[CacheKey]:
        by_context = self._index.get(group)
        return list(by_context.get(context, ())) if by_context is not None else []

    # -- single flight ---------------------------------------------------------------------------------

    def _list_flight(self, flight: _Flight) -> None:
        self._flights[flight.key] = flight
        method, uri = flight.group
        self._flights_of.setdefault(method, {}).setdefault(uri, {})[flight.key] = flight

    def _unlist_flight(self, flight: _Flight) -> None:
        del self._flights[flight.key]
        method, uri = flight.group
        by_uri = self._flights_of[method]
        flights = by_uri[uri]
        del flights[flight.key]
        if not flights:  # an index that only grows would leak every URI ever read
            del by_uri[uri]
            if not by_uri:
                del self._flights_of[method]

    async def fetch(
        self,
        method: str,
        params: JsonObject,
        context: str,
        forward: Callable[[Callable[[], None]], Awaitable[Reply]],
        ticket: int = 0,
        client: str = "",
    ) -> tuple[Reply | None, JsonObject | None]:
        """Forward once for everyone asking the same now (`ticket`: when this request started, on the watch
        engine's clock, so an answer older than a watch's latest look is not kept). `forward(started)` calls
        `started` once the request holds its slot upstream: until then the flight is its `client`'s alone (it
        waits in that client's fair-share queue, and another client must not wait behind it: invariant 20);
        from then on anyone of the context may join it.

        Returns (the leader's own reply, None) for the request that went upstream, or (None, shared
        answer) for one that joined; (None, None) means the leader's answer could not be shared (a
        stream) and the caller should forward on its own.
        """
        shared_key: _FlightKey = (method, _params_key(params), context)
        own_key: _FlightKey = (*shared_key, client)
        flight = self._flights.get(shared_key) or self._flights.get(own_key)
        if flight is not None:
            self._metrics.singleflight_joins.inc()
            return None, await asyncio.shield(flight.future)
        loop = asyncio.get_running_loop()
        flight = _Flight(loop.create_future(), _group(method, params), own_key)
        self._list_flight(flight)

        def upstream_bound() -> None:
            if self._flights.get(own_key) is flight and shared_key not in self._flights:
                self._unlist_flight(flight)
                flight.key = shared_key
                self._list_flight(flight)

        shared: JsonObject | None = None
        started = self._clock()
        try:
            reply = await forward(upstream_bound)
            received_at = self._clock()
            message = reply.message
            if reply.stream is None and 200 <= reply.status < 300 and isinstance(message, dict):
                if "result" in message or "error" in message:
                    shared = message
                if isinstance(message.get("result"), dict) and not flight.invalidated:
                    self._store(method, params, context, message["result"], received_at, ticket, started)
            return reply, None
        finally:
            if self._flights.get(flight.key) is flight:
                self._unlist_flight(flight)
            if not flight.future.done():
                flight.future.set_result(shared)

    def refused(self, method: str, params: JsonObject, context: str) -> None:
        """The upstream refused `context` this request (401/403): it must prove access again before a shared
        answer reaches it."""
        entry = self._cache.get((method, _params_key(params), PUBLIC))
        if entry is not None:
            entry.verified.discard(context)

    # -- invalidation ------------------------------------------------------------------------------------

    def observed(self, key: WatchKey, fingerprint: str, ticket: int) -> None:
        """Registry listener: a watch looked at the upstream (a baseline, a poll, a joiner's sync, a forwarded
        read). An entry from an older request that it contradicts goes now (invariant 17): a resource's when its
        content differs; a list page's (pages cannot be compared with a whole list) unless every look since before
        that page's request saw the whole list as it is now."""
        for group in _groups_of(key):
            latest = self._latest.get((group, key.context))
            unchanged_since: int | None = None  # every look from this ticket to this one saw the list as it is
            if latest is None or latest[0] < ticket:
                since = latest[2] if latest is not None and latest[1] == fingerprint else ticket
                self._latest[(group, key.context)] = (ticket, fingerprint, since)
                if since < ticket and group[0] != "resources/read":
                    unchanged_since = since
            for cache_key in self._keys_of(group, key.context):
                entry = self._cache.get(cache_key)
                if entry is None or entry.ticket >= ticket:
                    continue
                if unchanged_since is not None and entry.ticket > unchanged_since:
                    continue  # asked for after a look that saw this same list: it is the list as it still is
                if _differs(group, entry.result, fingerprint):
                    self._drop(group, cache_key)
        self._metrics.cache_bytes.set(self._cache.currsize)

    def _contradicted(self, group: Group, entry_context: str, result: JsonObject, ticket: int) -> bool:
        latest = self._latest.get((group, entry_context))
        return latest is not None and ticket < latest[0] and _differs(group, result, latest[1])

    def on_change(self, event: ChangeEvent) -> None:
        """Bus listener: drop what the change made stale, before the streams hear of it. A watch's first look
        elsewhere (a baseline event) drops only what it contradicts."""
        if event.baseline:
            for group in _groups_of(event.key):
                for cache_key in self._keys_of(group, event.key.context):
                    entry = self._cache.get(cache_key)
                    if entry is not None and _differs(group, entry.result, event.fingerprint):
                        self._drop(group, cache_key)
            return
        for group in _groups_of(event.key):
            # Every context's entries of the group go, not only the event's (a change seen by one context says
            # the upstream changed; another context's copy of it is no fresher).
            for keys in self._index.pop(group, {}).values():
                for cache_key in keys:
                    self._cache.pop(cache_key, None)
            method, uri = group
            by_uri = self._flights_of.get(method)
            if by_uri is None:
                continue
            # A list's group (uri None) makes every flight of its method unjoinable, whatever URI a request named.
            stale = list(by_uri.values()) if uri is None else [by_uri.pop(uri, {})]
            for flights in stale:
                for flight in flights.values():
                    flight.invalidated = True
                    del self._flights[flight.key]
            if uri is None or not by_uri:
                del self._flights_of[method]
        self._metrics.cache_bytes.set(self._cache.currsize)
