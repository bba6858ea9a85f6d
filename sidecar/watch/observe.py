"""One look at the upstream for a watch: read a resource, or walk every page of a list, and fingerprint it.

Only the requests are made here: what an answer or an error means is decided with no I/O (`read_failed` and
`observation_from_read` for a read, `ListWalk` for a list's pages).

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
from sidecar.upstream.base import Look
from sidecar.watch.list_walk import ListWalk
from sidecar.watch.observation import Observation, observation_from_read, read_failed
from sidecar.watch.rules import NO_RULES, Rules

__all__ = ["Listed", "observe"]

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
    except ValueError as exc:  # an answer that cannot be fingerprinted, or a list too long, is a bad answer
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
            if (state := read_failed(exc, errors_are_states=errors_are_states)) is None:
                raise
            return state
        return observation_from_read(result, rules.for_uri(uri))
    walk = ListWalk(kind)
    while (request := walk.next_request()) is not None:
        method, params = request
        try:
            result = await upstream.call(method, params, identity)
        except UpstreamRpcError as exc:
            if not walk.failed(exc):
                raise
            continue
        walk.answered(result)
    observation = walk.observation()  # raises if unreadable
    if listed is not None:
        listed(walk.entries(), walk.public)
    return observation
