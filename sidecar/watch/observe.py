"""One look at the upstream for a watch: read a resource, or walk every page of a list, and fingerprint it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sidecar.changes import WatchKind
from sidecar.identity import Identity
from sidecar.protocol.errors import UpstreamBadResponse, UpstreamRpcError
from sidecar.protocol.lists import LIST_KINDS
from sidecar.upstream.base import Upstream
from sidecar.watch.fingerprint import ABSENT, fingerprint_contents, fingerprint_items
from sidecar.watch.rules import NO_RULES, Rule, Rules

__all__ = ["MAX_LIST_PAGES", "Observation", "is_not_found", "observation_from_read", "observe"]

MAX_LIST_PAGES = 100
"""A list longer than this many pages is treated as an upstream fault (a cursor that never ends)."""

_NOT_FOUND_CODES = (-32602, -32002)


@dataclass(frozen=True, slots=True)
class Observation:
    """What one look saw: the fingerprint, the upstream's freshness hint, and whether the result is public."""

    fingerprint: str
    ttl_ms: int | None
    public: bool

    @property
    def found(self) -> bool:
        return self.fingerprint != ABSENT


def is_not_found(error: UpstreamRpcError) -> bool:
    return error.code in _NOT_FOUND_CODES


def _ttl(result: dict[str, Any]) -> int | None:
    ttl = result.get("ttlMs")
    return ttl if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl > 0 else None


def observation_from_read(result: dict[str, Any], rule: Rule | None = None) -> Observation:
    """The observation a `resources/read` result gives (a forwarded read is evidence too); `rule`: the URI's
    `polling.rules` entry, whose ignored parts do not count."""
    contents = result.get("contents")
    if rule is not None:
        contents = rule.significant(contents)
    return Observation(fingerprint_contents(contents), _ttl(result), result.get("cacheScope") == "public")


async def observe(
    upstream: Upstream, kind: WatchKind, uri: str | None, identity: Identity, rules: Rules = NO_RULES
) -> Observation:
    """Look once, as `identity`; raises UpstreamError when the upstream cannot answer (a not-found resource is an
    answer)."""
    try:
        return await _observe(upstream, kind, uri, identity, rules)
    except ValueError as exc:  # an answer that cannot be fingerprinted is a bad answer for this key
        raise UpstreamBadResponse(upstream.url, str(exc)) from exc


async def _observe(
    upstream: Upstream, kind: WatchKind, uri: str | None, identity: Identity, rules: Rules
) -> Observation:
    if kind == "resource":
        try:
            result = await upstream.call("resources/read", {"uri": uri}, identity)
        except UpstreamRpcError as exc:
            if is_not_found(exc):
                return Observation(ABSENT, None, False)
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
            ttl = _ttl(result)
            if ttl is not None:
                ttls.append(ttl)
            public = public and result.get("cacheScope") == "public"
            next_cursor = result.get("nextCursor")
            if not isinstance(next_cursor, str):
                break
            cursor = next_cursor
        else:
            raise UpstreamBadResponse(upstream.url, f"{method} has more than {MAX_LIST_PAGES} pages")
    return Observation(fingerprint_items(items), min(ttls) if ttls else None, public)
