"""One look at the upstream for a watch: read a resource, or walk every page of a list, and fingerprint it.

What a look learns is about the resource or about the upstream (invariant 24): content, a not-found and (for a
watch's poll) a JSON-RPC error the upstream answered are the resource's state; a transport failure, a timeout, an
HTTP 5xx or a refusal (401/403) is a fault, raised as an UpstreamError.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sidecar.changes import WatchKind
from sidecar.identity import Identity
from sidecar.protocol.errors import UpstreamBadResponse, UpstreamRpcError
from sidecar.protocol.lists import LIST_KINDS
from sidecar.upstream.base import Look
from sidecar.watch.fingerprint import ABSENT, fingerprint_items
from sidecar.watch.observation import Observation, error_state, is_not_found, observation_from_read, ttl_hint
from sidecar.watch.rules import NO_RULES, Rules

__all__ = ["MAX_LIST_PAGES", "Listed", "observe"]

MAX_LIST_PAGES = 100
"""A list longer than this many pages is treated as an upstream fault (a cursor that never ends)."""

Listed = Callable[[list[Any], bool], None]
"""Told a list's entries, every page of it, and whether every page was public, once a look has walked it."""


async def observe(
    upstream: Look,
    kind: WatchKind,
    uri: str | None,
    identity: Identity,
    rules: Rules = NO_RULES,
    *,
    errors_are_states: bool = False,
    listed: Listed | None = None,
) -> Observation:
    """Look once, as `identity`; raises UpstreamError when the upstream cannot answer (a not-found resource is an
    answer, and with `errors_are_states`, a watch's poll, so is a resource read answered with an error). A list
    look's entries go to `listed`, if given."""
    try:
        return await _observe(upstream, kind, uri, identity, rules, errors_are_states, listed)
    except ValueError as exc:  # an answer that cannot be fingerprinted is a bad answer for this key
        raise UpstreamBadResponse(upstream.url, str(exc)) from exc


async def _observe(
    upstream: Look,
    kind: WatchKind,
    uri: str | None,
    identity: Identity,
    rules: Rules,
    errors_are_states: bool,
    listed: Listed | None,
) -> Observation:
    if kind == "resource":
        try:
            result = await upstream.call("resources/read", {"uri": uri}, identity)
        except UpstreamRpcError as exc:
            if is_not_found(exc):
                return Observation(ABSENT, None, False)
            # A first read that fails still fails its caller (nothing to subscribe to yet); a watch's poll sees
            # the resource turn into the error.
            if errors_are_states and (state := error_state(exc)) is not None:
                return state
            raise
        return observation_from_read(result, rules.for_uri(uri))
    items: list[Any] = []
    ttls: list[int] = []
    public = True
    for method, field in LIST_KINDS[kind].methods:
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            params: dict[str, Any] = {} if cursor is None else {"cursor": cursor}
            try:
                result = await upstream.call(method, params, identity)
            except UpstreamRpcError as exc:
                if method == "resources/templates/list" and exc.code == -32601:
                    break  # an upstream without templates
                raise
            page = result.get(field)
            items.extend((method, item) for item in (page if isinstance(page, list) else []))
            ttl = ttl_hint(result)
            if ttl is not None:
                ttls.append(ttl)
            public = public and result.get("cacheScope") == "public"
            next_cursor = result.get("nextCursor")
            if not isinstance(next_cursor, str):
                break
            cursor = next_cursor
        else:
            raise UpstreamBadResponse(upstream.url, f"{method} has more than {MAX_LIST_PAGES} pages")
    observation = Observation(fingerprint_items(items), min(ttls) if ttls else None, public)  # raises if unreadable
    if listed is not None:
        listed([item for _, item in items], public)
    return observation
