"""Authorization contexts: who a request is from, as the upstream could tell, named by a keyed hash; and the
client a request counts against for fair share.

One rule (invariant 18): a request's context is derived once, from every forwarded header that is not
declared non-identifying (`upstream.non_identity_headers`), names compared case-insensitively, and a
request carrying an identity header twice is refused, since the sidecar and the upstream could read
different values. Upstream sessions, cache entries, watches and the credentials the sidecar polls with
all hang off that one context, so adding a forwarded header can never merge two users.

The context is the unit of *isolation*. The unit of *fairness* is the client (invariant 20): a request with
identifying headers counts against its context, one without them against its address, so the many anonymous
clients of an unauthenticated upstream do not share one fair share (they still share one context). Within a
client, a request waits in a lane: the downstream handler puts a credential the upstream has not accepted yet
in a lane of its own within its address.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from multidict import CIMultiDict, CIMultiDictProxy

from sidecar.protocol import InvalidRequest

__all__ = ["ANONYMOUS", "ANONYMOUS_IDENTITY", "PUBLIC", "Identity", "IdentityRule"]

PUBLIC = "public"
"""The context of results whose cacheScope is public: shared by every client."""

ANONYMOUS = "anon"
"""The context of requests without any identifying header."""

Headers = CIMultiDictProxy[str] | CIMultiDict[str] | Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Identity:
    """A request's authorization context and the identifying headers that make it (lower-case names, sorted),
    which are what the sidecar sends when it acts for that context, and the client it counts against for fair
    share and the lane it waits in within that client's turn (neither part of its equality: two addresses of one
    context are one identity). Never logged; `context` is safe to log."""

    context: str
    headers: tuple[tuple[str, str], ...] = ()
    client: str = field(default=ANONYMOUS, compare=False)
    lane: str = field(default="", compare=False)
    """"": the client's own requests; a context: a credential waiting its own turn among its address's requests."""

    @property
    def is_anonymous(self) -> bool:
        return not self.headers

    def as_headers(self) -> dict[str, str]:
        return dict(self.headers)

    def __repr__(self) -> str:  # a credential must not reach a log through a repr
        return f"Identity({self.context!r})"


ANONYMOUS_IDENTITY = Identity(ANONYMOUS)


class IdentityRule:
    """Derives the identity of requests and the headers forwarded for them."""

    def __init__(self, forward_headers: Iterable[str], non_identity_headers: Iterable[str]) -> None:
        non_identity = {name.lower() for name in non_identity_headers}
        self.forward_headers = tuple(dict.fromkeys(name.lower() for name in forward_headers))
        self.identity_headers = tuple(sorted(name for name in self.forward_headers if name not in non_identity))
        self._key = secrets.token_bytes(32)

    def use_key(self, key: bytes) -> None:
        """Name contexts with a key shared by every replica (from Redis): one identity, one context cluster-wide."""
        self._key = key

    def of(self, headers: Headers, address: str | None = None) -> Identity:
        """The identity of a request with these headers from the client at `address` (what an anonymous request
        counts against for fair share); InvalidRequest (400) when an identity header repeats."""
        found = []
        for name in self.identity_headers:
            values = _values(headers, name)
            if len(values) > 1:
                raise InvalidRequest(f"the {name} header appears more than once", http_status=400)
            if values:
                found.append((name, values[0]))
        if not found and address is not None:
            return Identity(ANONYMOUS, client=f"addr-{address}")
        return self.identity(tuple(found))

    def identity(self, headers: tuple[tuple[str, str], ...]) -> Identity:
        if not headers:
            return ANONYMOUS_IDENTITY
        digest = hmac.new(self._key, digestmod=hashlib.sha256)
        for name, value in headers:
            digest.update(name.encode() + b"\0" + value.encode("utf-8", "surrogateescape") + b"\0")
        context = f"ctx-{digest.hexdigest()[:20]}"
        return Identity(context, headers, client=context)

    def forwarded(self, headers: Headers) -> dict[str, str]:
        """The allowlisted client headers as they go upstream: the first value of each (identity headers were
        checked to be single), never Host, cookies or hop-by-hop headers."""
        forwarded = {}
        for name in self.forward_headers:
            values = _values(headers, name)
            if values:
                forwarded[name] = values[0]
        return forwarded


def _values(headers: Headers, name: str) -> list[str]:
    if isinstance(headers, CIMultiDictProxy | CIMultiDict):
        return headers.getall(name, [])
    return [value for key, value in headers.items() if key.lower() == name]
