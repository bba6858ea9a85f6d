"""Where the cluster's coordination lives in Redis: key and channel names, buckets, and the wire form of messages.

Keys hash into buckets by (kind, uri), so every context's key of one URI lands in one bucket and a cache entry,
which knows only its URI, finds its channel. A bucket's names share a hash tag, `{mcp-sidecar:b<n>}`: on Redis
Cluster its interest sets, states and channel live in one slot (one shard, sharded pub/sub there).

    mcp-sidecar:replicas                        ZSET instance -> heartbeat deadline (ms, Redis clock)
    mcp-sidecar:readers                         HASH instance -> it cannot read the upstream (`sidecar.bus.readers`)
    mcp-sidecar:interest-of:<instance>          SET of "<bucket>:<key hash>" that instance is interested in
    {mcp-sidecar:b<n>}:interest:<key hash>      SET of instances with local streams on the key
    {mcp-sidecar:b<n>}:state:<key hash>         HASH f (last fingerprint told), g (its generation)
    {mcp-sidecar:b<n>}:events                   channel: changes, first looks and interest of the bucket's keys
    mcp-sidecar:revalidate                      channel: writes through a replica, replicas leaving, declarations
    mcp-sidecar:partition-key                   the shared secret that names authorization contexts
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import orjson

from sidecar.changes import ChangeEvent, WatchKey, WatchKind

__all__ = [
    "CONTEXT_NAMING_KEY",
    "DEFAULT_BUCKETS",
    "HINTS_CHANNEL",
    "PREFIX",
    "READERS",
    "REPLICAS",
    "Interest",
    "Layout",
    "decode",
    "encode_event",
    "encode_interest",
    "key_hash",
    "stored_generation",
    "text",
]

PREFIX = "mcp-sidecar:"
REPLICAS = PREFIX + "replicas"
READERS = PREFIX + "readers"
HINTS_CHANNEL = PREFIX + "revalidate"
CONTEXT_NAMING_KEY = PREFIX + "partition-key"  # the stored name stays: replicas of every version share it
DEFAULT_BUCKETS = 1024
"""Channels a fleet's events spread over: a replica with streams on k keys listens to at most k of them, and
hears the changes of about k/buckets of all keys. More buckets route more precisely and cost more channels."""


def key_hash(key: WatchKey) -> str:
    """A stable name for a key in Redis; says nothing about the URI or the context."""
    return hashlib.sha256(f"{key.kind}\0{key.uri or ''}\0{key.context}".encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Layout:
    """Names for a fleet configured with `buckets` buckets (every replica must use the same number)."""

    buckets: int = DEFAULT_BUCKETS

    def bucket(self, kind: WatchKind, uri: str | None) -> int:
        digest = hashlib.sha256(f"{kind}\0{uri or ''}".encode()).digest()
        return int.from_bytes(digest[:4], "big") % self.buckets

    def bucket_of(self, key: WatchKey) -> int:
        return self.bucket(key.kind, key.uri)

    def state_of(self, key: WatchKey) -> str:
        return self.state(self.bucket_of(key), key_hash(key))

    def channel_of(self, key: WatchKey) -> str:
        return self.channel(self.bucket_of(key))

    @staticmethod
    def tag(bucket: int) -> str:
        return f"{{{PREFIX}b{bucket}}}"

    def channel(self, bucket: int) -> str:
        return self.tag(bucket) + ":events"

    def interest(self, bucket: int, hashed: str) -> str:
        return f"{self.tag(bucket)}:interest:{hashed}"

    def state(self, bucket: int, hashed: str) -> str:
        return f"{self.tag(bucket)}:state:{hashed}"

    @staticmethod
    def interest_of(instance: str) -> str:
        return PREFIX + "interest-of:" + instance

    def bucket_of_channel(self, channel: bytes | str) -> int | None:
        name = channel.decode() if isinstance(channel, bytes) else channel
        head = "{" + PREFIX + "b"
        if not name.startswith(head) or not name.endswith("}:events"):
            return None
        try:
            return int(name[len(head) : -len("}:events")])
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class Interest:
    """A replica's interest in a key (by its hash) arrived or left."""

    origin: str
    hashed: str
    present: bool


def encode_event(event: ChangeEvent, origin: str) -> bytes:
    key = event.key
    return orjson.dumps(
        {
            "o": origin,
            "k": key.kind,
            "u": key.uri,
            "p": key.context,  # "p" on the wire, for replicas of every version
            "f": event.fingerprint,
            "g": event.generation,
            "t": event.detected_at,
            "b": event.baseline,
        }
    )


def encode_interest(interest: Interest) -> bytes:
    return orjson.dumps({"o": interest.origin, "i": interest.hashed, "a": interest.present})


def decode(raw: bytes) -> tuple[str, ChangeEvent | Interest]:
    """(origin, message); raises ValueError, KeyError or TypeError on a message we did not write."""
    data = orjson.loads(raw)
    origin = str(data["o"])
    if "i" in data:
        return origin, Interest(origin, str(data["i"]), bool(data["a"]))
    key = WatchKey(data["k"], data["u"], data["p"])
    return origin, ChangeEvent(key, data["f"], int(data["g"]), float(data["t"]), baseline=bool(data.get("b", False)))


def text(value: bytes | str) -> str:
    """A value as Redis returned it (bytes, or str on a client that decodes)."""
    return value.decode() if isinstance(value, bytes) else value


def stored_generation(raw: object) -> int | None:
    """A stored generation (absent: 0), or None when it is not decimal digits alone below 2**53 (as the scripts
    read it: `int` alone would take " 7" or "7_0", Lua's `tonumber` "7.0" or "0x10")."""
    if raw is None:
        return 0
    if isinstance(raw, int) and not isinstance(raw, bool):
        digits = str(raw)
    elif isinstance(raw, bytes | str):
        digits = text(raw)
    else:
        return None
    if not (digits.isascii() and digits.isdigit()):
        return None
    generation = int(digits)
    return generation if generation < 2**53 else None
