"""Playbooks for the rules of the upstream's own notification streams (`sidecar.watch.native_rules`): events fed at
the times the test says, the exact commands expected back. No loop and no clock: a stream's step is answered by the
event its driver would feed (`Probed`, `Acknowledged`, `SubscribeAnswered`, `StreamFailed`, ...).

The helpers spell out the commands every test would repeat: a key's coverage and hints go to its own context's
watch and to the public one, each a pair of commands.
"""

from __future__ import annotations

from sidecar.changes import WatchKey, WatchKind
from sidecar.config import PollingConfig
from sidecar.identity import PUBLIC, Identity
from sidecar.protocol.types import JsonObject
from sidecar.watch.native_events import (
    Acknowledged,
    Began,
    Command,
    CoverKey,
    Event,
    Held,
    HintKey,
    Listen,
    OpenSession,
    Probe,
    Probed,
    RetryDue,
    SessionOpened,
    Start,
    StreamsOpen,
    Subscribe,
    SubscribeAnswered,
    Wait,
)
from sidecar.watch.native_rules import NativeRules
from tests.kit import ACK
from tests.kit.playbook import Playbook
from tests.unit.watch.native.native_harness import ALICE, CONFIG, DOC, EVERYTHING

__all__ = [
    "Book",
    "acked",
    "book",
    "cover",
    "hint",
    "listened",
    "listening",
    "listening_to_doc_and_tools",
    "rules",
    "subscribed",
]

Book = Playbook[Event, Command]


def book(config: PollingConfig = CONFIG, now: float = 0.0) -> Book:
    return Book(NativeRules(config), now)


def rules(play: Book) -> NativeRules:
    engine = play.engine
    assert isinstance(engine, NativeRules)
    return engine


def cover(kind: WatchKind, uri: str | None, context: str, *, own: bool, public: bool) -> list[Command]:
    """A key whose coverage changed: the public watch of it, then the context's own, told what covers them now."""
    return [CoverKey(WatchKey(kind, uri, PUBLIC), public), CoverKey(WatchKey(kind, uri, context), own)]


def hint(kind: WatchKind, uri: str | None, context: str, *, warm: bool) -> list[Command]:
    """(kind, uri) may have changed as `context` sees it: the public watch of it, then the context's own, look."""
    return [HintKey(WatchKey(kind, uri, PUBLIC), warm), HintKey(WatchKey(kind, uri, context), warm)]


def acked(wanted: JsonObject) -> JsonObject:
    """A listen's acknowledgment honouring all it asked for."""
    return {"method": ACK, "params": {"notifications": wanted}}


def listening(
    play: Book, stream: int, who: Identity, kind: WatchKind, uri: str | None, capabilities: JsonObject = EVERYTHING
) -> JsonObject:
    """A context's first hold on a 2026-07-28 upstream: its stream starts, probes, and listens for that key; the
    filter it listens with (not yet acknowledged)."""
    play.step(Held(who, kind, uri, capabilities), Start(stream, who))
    play.step(Began(stream), Probe(stream))
    commands = play.feed(Probed(stream, True, capabilities))
    assert len(commands) == 1 and isinstance(commands[0], Listen), commands
    return commands[0].wanted


def subscribed(
    play: Book, stream: int, who: Identity, uri: str, *, again: bool = False, capabilities: JsonObject = EVERYTHING
) -> None:
    """A context's first hold of a resource on a 2025-11-25 upstream (`again`: its stream's retry after a failure):
    the stream probes the upstream, its session stream opens, the URI is subscribed to and covered (for its own watch
    and the public one), polled once, and the stream waits."""
    if again:
        play.step(RetryDue(stream), Probe(stream))
    else:
        play.step(Held(who, "resource", uri, capabilities), Start(stream, who))
        play.step(Began(stream), Probe(stream))
    play.step(Probed(stream, False, capabilities), OpenSession(stream))
    play.step(SessionOpened(stream), StreamsOpen(1), Subscribe(stream, uri))
    play.step(
        SubscribeAnswered(stream, uri, ok=True),
        *cover("resource", uri, who.context, own=True, public=True),
        *hint("resource", uri, who.context, warm=False),
        Wait(stream),
    )


def listening_to_doc_and_tools(play: Book, capabilities: JsonObject) -> None:
    """Alice's stream (1), held for DOC and the tools list, probes a 2026-07-28 upstream, listens for both, and is
    acknowledged with both: each covered (her watch and the public one), polled once, and the stream waits."""
    play.step(Began(1), Probe(1))
    wanted = {"resourceSubscriptions": [DOC], "toolsListChanged": True}
    play.step(Probed(1, True, capabilities), Listen(1, wanted))
    play.step(
        Acknowledged(1, acked(wanted)),
        StreamsOpen(1),
        *cover("resource", DOC, "alice", own=True, public=True),
        *cover("tools_list", None, "alice", own=True, public=True),
        *hint("resource", DOC, "alice", warm=False),
        *hint("tools_list", None, "alice", warm=False),
        Wait(1),
    )


def listened(play: Book) -> JsonObject:
    """Alice's first hold of DOC on a 2026-07-28 upstream: her stream (1) listens for it and is acknowledged, DOC
    covered (her watch and the public one) and polled once, and the stream waits; the filter it listened with."""
    wanted = listening(play, 1, ALICE, "resource", DOC)
    play.step(
        Acknowledged(1, acked(wanted)),
        StreamsOpen(1),
        *cover("resource", DOC, "alice", own=True, public=True),
        *hint("resource", DOC, "alice", warm=False),
        Wait(1),
    )
    return wanted
