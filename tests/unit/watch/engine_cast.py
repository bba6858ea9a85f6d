"""Who and what the engine's playbooks speak of: identities, keys, looks, and an engine with a known config."""

from __future__ import annotations

from collections.abc import Callable

from sidecar.changes import WatchKey
from sidecar.config import PollingConfig
from sidecar.identity import ANONYMOUS_IDENTITY, PUBLIC, Identity
from sidecar.watch.engine import Engine
from sidecar.watch.engine.commands import (
    Command,
    Cover,
    Observed,
    PublishFirst,
    Resolve,
    SetTimer,
    StartLook,
    StartWatch,
    Track,
)
from sidecar.watch.engine.events import Event, LookDone, Published, Subscribe
from sidecar.watch.fingerprint import ABSENT
from sidecar.watch.observation import Observation
from sidecar.watch.rules import Rules
from tests.kit.playbook import Playbook

Book = Playbook[Event, Command]
"""A playbook of the registry's engine."""

__all__ = [
    "ALICE",
    "ALICE_PHONE",
    "ANON",
    "BOB",
    "DOC",
    "GONE",
    "LINGER_S",
    "OTHER",
    "POLL_S",
    "PRIVATE",
    "PUBLIC_V1",
    "PUBLIC_V2",
    "SCHEDULE_CONFIG",
    "V1",
    "V2",
    "book",
    "holders",
    "joined",
    "key",
    "polling_engine",
    "started",
]

LINGER_S = 8.0
SCHEDULE_CONFIG = PollingConfig(
    default_interval_ms=5000,
    min_interval_ms=250,
    max_interval_ms=60000,
    jitter=0.1,
    backoff_initial_ms=1000,
    backoff_max_ms=8000,
)
"""A poll schedule's tests: 5 s without ttlMs, a 250 ms floor, 10% jitter, backoff from 1 s to 8 s."""
POLL_S = 5.0
"""A watch's interval here: the default (its looks carry no ttlMs), with no jitter."""
ABSENT_TTL_S = 5.0
DOC = "file:///doc"
OTHER = "file:///other"

ALICE = Identity("alice", (("authorization", "Bearer a"),), client="alice-laptop")
ALICE_PHONE = Identity("alice", ALICE.headers, client="alice-phone")
BOB = Identity("bob", (("authorization", "Bearer b"),), client="bob-laptop")
ANON = ANONYMOUS_IDENTITY
PRIVATE = "private"

V1 = Observation("fp-v1", None, False)
V2 = Observation("fp-v2", None, False)
PUBLIC_V1 = Observation("fp-v1", None, True)
PUBLIC_V2 = Observation("fp-v2", None, True)
GONE = Observation(ABSENT, None, False)


def key(context: str, uri: str | None = DOC) -> WatchKey:
    return WatchKey("resource", uri, PUBLIC if context == "public" else context)


def polling_engine(
    polling: PollingConfig = SCHEDULE_CONFIG, *, may_poll: Callable[[WatchKey], bool] = lambda key: True
) -> Engine:
    """An engine whose watches poll on `polling`'s schedule, drawing the midpoint of its jitter (none)."""
    return Engine(
        linger_s=LINGER_S,
        absent_ttl_s=ABSENT_TTL_S,
        rate_per_s=1_000.0,
        rules=Rules([]),
        polling=polling,
        rand=lambda: 0.5,
        may_poll=may_poll,
    )


def book(*, rate_per_s: float = 1_000.0, now: float = 0.0) -> Book:
    """A fresh engine: lingers 8 s, remembers a missing resource 5 s, `rate_per_s` first reads a second a client."""
    engine = Engine(
        linger_s=LINGER_S, absent_ttl_s=ABSENT_TTL_S, rate_per_s=rate_per_s, rules=Rules([]), rand=lambda: 0.5
    )
    return Book(engine, now)


def holders(play: Book, watched: WatchKey) -> int:
    """How many streams hold `watched` (0 once it has ended)."""
    record = play.engine.record(watched)
    return 0 if record is None else record.holders


def started(play: Book, waiter: int, look: int, who: Identity, seen: Observation, ticket: int) -> WatchKey:
    """`who` subscribes to DOC and its first read (`look`) sees `seen` at `ticket`: a new watch it holds."""
    watched = key(PUBLIC if seen.public else who.context)
    play.step(Subscribe(waiter, "resource", DOC, who), StartLook(look, "resource", DOC, who, paced=False))
    first = play.feed(LookDone(look, ticket, seen))
    # Its first poll is armed an interval after its first look (the default 5 s: no ttlMs, no jitter here).
    assert first[0] == StartWatch(watched, seen, ticket) and first[2] == PublishFirst(look, watched, seen.fingerprint)
    assert isinstance(first[1], SetTimer) and first[1].when == play.now + POLL_S and len(first) == 3, first
    play.step(Published(look), Track(watched), Cover(who, "resource", DOC), Resolve(waiter, watched))
    return watched


def joined(play: Book, waiter: int, who: Identity, public: WatchKey, ticket: int) -> None:
    """`who`, new to the public watch of DOC, subscribes: its own first read (look `waiter`) sees the public
    content at `ticket`, which proves its access; it holds the watch from then on."""
    play.step(Subscribe(waiter, "resource", DOC, who), StartLook(waiter, "resource", DOC, who, paced=False))
    play.step(
        LookDone(waiter, ticket, PUBLIC_V1),
        Observed(public, PUBLIC_V1.fingerprint, ticket),
        Cover(who, "resource", DOC),
        Resolve(waiter, public),
    )
