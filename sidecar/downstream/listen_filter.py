"""What a listen asks for (its filter) and what its ack answers: the part the sidecar honours, and for the rest
the JSON-RPC error that says why it was left out.

Leaving a URI out of the ack is the spec's only way to refuse it (invariant 2). Said that way alone, a mistyped
URI and a refused one look the same as "nothing will ever change", so the ack also names each left-out part, in
our own `_meta` key, with the code and message a read would have got; the client asked for those URIs, so
nothing it did not know leaks. The log counts them by reason, naming the URIs as the logs do everywhere (an
identified context's hashed, see `sidecar.observability.naming`). A 2025-11-25 `resources/subscribe` refused
for a URI is logged the same way.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.changes import WatchKind
from sidecar.identity import Identity
from sidecar.observability.naming import context_label, shown_uri
from sidecar.protocol import (
    LIST_KINDS,
    InvalidParams,
    JsonObject,
    RpcError,
    TooManyRequests,
    UpstreamError,
    UpstreamHTTPError,
)

__all__ = ["Ack", "Asked", "LeftOut", "SubscriptionFilter", "log_left_out", "parse_filter"]

logger = logging.getLogger(__name__)

_URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")
_LOGGED_URIS = 10
"""URIs a log line names per reason at most (its counts cover them all)."""


@dataclass(frozen=True, slots=True)
class SubscriptionFilter:
    """What a listen request asked for: list kinds and resource URIs (deduplicated, in the order given)."""

    lists: tuple[WatchKind, ...]
    uris: tuple[str, ...]


def parse_filter(params: dict[str, Any], max_uri_length: int) -> SubscriptionFilter:
    """Validate `params.notifications`; a malformed filter is -32602 before any stream opens."""
    notifications = params.get("notifications")
    if not isinstance(notifications, dict):
        raise InvalidParams("params.notifications must be an object (a SubscriptionFilter)")
    lists: list[WatchKind] = []
    for row in LIST_KINDS.values():
        value = notifications.get(row.filter_field, False)
        if not isinstance(value, bool):
            raise InvalidParams(f"notifications.{row.filter_field} must be a boolean")
        if value:
            lists.append(row.kind)
    uris = notifications.get("resourceSubscriptions", [])
    if not isinstance(uris, list):
        raise InvalidParams("notifications.resourceSubscriptions must be an array of URIs")
    for uri in uris:
        if not isinstance(uri, str) or not _URI_SCHEME.match(uri):
            raise InvalidParams("notifications.resourceSubscriptions must contain only URIs")
        if len(uri) > max_uri_length:
            raise InvalidParams(f"a subscribed URI is longer than {max_uri_length} characters")
    return SubscriptionFilter(tuple(lists), tuple(dict.fromkeys(uris)))


@dataclass(frozen=True, slots=True)
class LeftOut:
    """One URI (or list field) not honoured, with the JSON-RPC error that says why, and a short reason the log
    counts by (a fixed word, never the message)."""

    reason: str
    code: int
    message: str
    uri: str | None = None
    notification: str | None = None
    """The filter field of a list kind (`promptsListChanged`), for a list left out."""

    @staticmethod
    def not_found(uri: str | None, notification: str | None = None) -> LeftOut:
        # The 2026-07-28 code for a missing resource (protocol.md §5): the ack speaks that revision.
        return LeftOut("not_found", InvalidParams.code, "Resource not found", uri, notification)

    @staticmethod
    def over_limit(uri: str, limit: int) -> LeftOut:
        message = f"a listen may subscribe to at most {limit} URIs (streams.max_uris_per_stream)"
        return LeftOut("max_uris_per_stream", InvalidParams.code, message, uri)

    @staticmethod
    def unsupported(notification: str, primitive: str) -> LeftOut:
        return LeftOut("unsupported", -32601, f"the upstream has no {primitive}", notification=notification)

    @staticmethod
    def answered(reason: str, error: RpcError, uri: str) -> LeftOut:
        """Left out with the error the client is answered (a 2025-11-25 subscribe refused)."""
        return LeftOut(reason, error.code, error.message, uri)

    @staticmethod
    def refused(error: UpstreamError | RpcError, uri: str | None, notification: str | None = None) -> LeftOut:
        """Its first read failed: the error the client would get for that read."""
        if isinstance(error, UpstreamHTTPError) and error.is_auth_failure:
            reason = "upstream_refused"
        elif isinstance(error, UpstreamError):
            reason = "upstream_error"
        else:
            reason = "rate_limited" if isinstance(error, TooManyRequests) else "refused"
        rpc = error.to_rpc(with_id=False) if isinstance(error, UpstreamError) else error  # the phrase: no address
        return LeftOut(reason, rpc.code, rpc.message, uri, notification)

    @staticmethod
    def internal(uri: str | None, notification: str | None = None) -> LeftOut:
        return LeftOut("internal", -32603, "Internal error", uri, notification)

    def as_meta(self) -> JsonObject:
        named: JsonObject = {"uri": self.uri} if self.uri is not None else {"notification": self.notification}
        return {**named, "code": self.code, "message": self.message}


@dataclass(frozen=True, slots=True)
class Asked:
    """One part of a filter the stream joins: a list kind (its filter field), or a resource URI."""

    kind: WatchKind
    notification: str | None
    uri: str | None


class Ack:
    """A listen's ack as it is composed, with no I/O: from the filter and the upstream's capabilities, what the
    stream joins (`asked`: each list kind the upstream has, then the URIs within `max_uris`); from each join's
    outcome, what it honours and what it leaves out with the reason (invariant 2)."""

    def __init__(self, wanted: SubscriptionFilter, capabilities: Container[str], max_uris: int) -> None:
        self.honoured: JsonObject = {}
        self.left_out: list[LeftOut] = []
        self.asked: list[Asked] = []
        for row in LIST_KINDS.values():
            if row.kind in wanted.lists:
                if row.primitive in capabilities:
                    self.asked.append(Asked(row.kind, row.filter_field, None))
                else:
                    self.left_out.append(LeftOut.unsupported(row.filter_field, row.primitive))
        self.asked += (Asked("resource", None, uri) for uri in wanted.uris[:max_uris])
        self.over_limit = [LeftOut.over_limit(uri, max_uris) for uri in wanted.uris[max_uris:]]
        """The URIs past `max_uris`, left out after the rest."""

    def settle(self, outcomes: Sequence[LeftOut | None]) -> None:
        """Each part asked, in the order asked, honoured (its outcome None) or left out (why)."""
        for part, left in zip(self.asked, outcomes, strict=True):
            if left is not None:
                self.left_out.append(left)
            elif part.uri is not None:
                self.honoured.setdefault("resourceSubscriptions", []).append(part.uri)
            elif part.notification is not None:
                self.honoured[part.notification] = True
        self.left_out += self.over_limit
        self.asked = []

    def refusal(self, failures: Sequence[UpstreamError | RpcError]) -> UpstreamError | RpcError | None:
        """What to answer instead of an ack that honours nothing because the upstream could not answer (an empty
        ack reads as "nothing exists"): a refused credential first, so the client re-authenticates."""
        if self.honoured or not failures:
            return None
        refused = (exc for exc in failures if isinstance(exc, UpstreamHTTPError) and exc.is_auth_failure)
        return next(refused, failures[0])

    def meta(self) -> list[JsonObject]:
        """The `_meta` entry naming what was left out (empty: nothing was)."""
        return [left.as_meta() for left in self.left_out]


def log_left_out(msg: str, left_out: Iterable[LeftOut], identity: Identity, **extra: Any) -> None:
    """One info line counting the left-out URIs by reason, naming them as the logs do (hashed for an identified
    context); nothing when no URI was left out (a list kind the upstream lacks is the upstream's, not news)."""
    counts: Counter[str] = Counter()
    named: dict[str, list[str | None]] = {}
    for left in left_out:
        if left.uri is None:
            continue
        counts[left.reason] += 1
        uris = named.setdefault(left.reason, [])
        if len(uris) < _LOGGED_URIS:
            uris.append(shown_uri("resource", left.uri, identity.context))
    if counts:
        logger.info(
            msg,
            extra={**extra, "context": context_label(identity.context), "left_out": dict(counts), "uris": named},
        )
