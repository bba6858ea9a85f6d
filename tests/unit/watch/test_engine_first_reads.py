"""The engine's first reads, as playbooks: a subscription's first look, shared by whoever asks for the same read
while it is in flight, paced per client, remembered when it finds nothing, and answered only once published; and a
joiner's look at a live watch."""

from __future__ import annotations

import pytest

from sidecar.changes import ChangeEvent, WatchKey
from sidecar.protocol.errors import UpstreamUnavailable
from sidecar.watch.engine import Stage
from sidecar.watch.engine.commands import (
    CancelTimer,
    Cover,
    Fail,
    Observed,
    Publish,
    PublishFirst,
    Resolve,
    SetTimer,
    StartLook,
    StartWatch,
    StopWatch,
    Track,
)
from sidecar.watch.engine.events import (
    ChangeHeard,
    Forwarded,
    Leave,
    LookDone,
    LookFailed,
    Published,
    Release,
    Subscribe,
    TimerFired,
)
from tests.unit.watch.engine_cast import (
    ALICE,
    ALICE_PHONE,
    BOB,
    DOC,
    GONE,
    LINGER_S,
    OTHER,
    POLL_S,
    PUBLIC_V1,
    PUBLIC_V2,
    V1,
    V2,
    book,
    holders,
    key,
    started,
)

DOWN = UpstreamUnavailable("scripted://upstream", "connection refused")


@pytest.mark.invariant(6)
def test_a_first_read_is_answered_only_once_its_look_is_published() -> None:
    play = book()
    play.step(Subscribe(1, "resource", DOC, ALICE), StartLook(1, "resource", DOC, ALICE, paced=False))
    watched = key("alice")
    play.step(
        LookDone(1, 7, V1),
        StartWatch(watched, V1, 7),
        SetTimer(-1, play.now + POLL_S),
        PublishFirst(1, watched, V1.fingerprint),
    )
    record = play.engine.record(watched)
    assert record is not None and record.stage is Stage.STARTING and record.holders == 0, "nobody answered yet"
    play.step(Published(1), Track(watched), Cover(ALICE, "resource", DOC), Resolve(1, watched))
    assert record.stage is Stage.LIVE and holders(play, watched) == 1


@pytest.mark.invariant(8)
def test_concurrent_first_interests_share_one_read_per_context() -> None:
    play = book()
    play.step(Subscribe(1, "resource", DOC, ALICE), StartLook(1, "resource", DOC, ALICE, paced=False))
    play.step(Subscribe(2, "resource", DOC, ALICE_PHONE))
    play.step(Subscribe(3, "resource", DOC, BOB), StartLook(2, "resource", DOC, BOB, paced=False))
    watched = key("alice")
    play.step(
        LookDone(1, 1, V1),
        StartWatch(watched, V1, 1),
        SetTimer(-1, play.now + POLL_S),
        PublishFirst(1, watched, V1.fingerprint),
    )
    # A watch still starting is joined (held at once), with a look of its own that starts after the caller asked.
    joined = [Track(watched), Cover(ALICE, "resource", DOC), StartLook(3, "resource", DOC, ALICE, paced=False)]
    play.step(Subscribe(4, "resource", DOC, ALICE), *joined)
    play.step(Published(1), Resolve(1, watched), Resolve(2, watched))
    assert holders(play, watched) == 3


@pytest.mark.invariant(20)
def test_a_read_paced_in_its_clients_turn_is_that_clients_alone() -> None:
    play = book(rate_per_s=1)
    play.step(Subscribe(1, "resource", OTHER, ALICE), StartLook(1, "resource", OTHER, ALICE, paced=False))
    play.step(Subscribe(2, "resource", DOC, ALICE), StartLook(2, "resource", DOC, ALICE, paced=True))
    # Alice's phone is another client, within its own rate: it must not wait in alice's laptop's queue.
    play.step(Subscribe(3, "resource", DOC, ALICE_PHONE), StartLook(3, "resource", DOC, ALICE_PHONE, paced=False))
    play.step(Subscribe(4, "resource", DOC, ALICE))  # the laptop's own paced read, which it shares
    play.step(Subscribe(5, "resource", DOC, ALICE_PHONE))  # one that went at once is anyone's
    play.at(1.0)
    play.step(Subscribe(6, "resource", OTHER, BOB), StartLook(4, "resource", OTHER, BOB, paced=False))
    play.step(Subscribe(7, "resource", OTHER, BOB))  # its token is spent, but it shares the read in flight


def test_a_client_saves_up_no_more_than_its_rate_of_first_reads() -> None:
    play = book(rate_per_s=2)
    uris = [f"file:///{n}" for n in range(6)]
    paced = [next(c for c in play.feed(Subscribe(n, "resource", uri, ALICE)) if isinstance(c, StartLook)).paced
             for n, uri in enumerate(uris[:3])]  # fmt: skip
    assert paced == [False, False, True]
    play.at(10.0)
    paced = [next(c for c in play.feed(Subscribe(n, "resource", uri, ALICE)) if isinstance(c, StartLook)).paced
             for n, uri in enumerate(uris[3:], 3)]  # fmt: skip
    assert paced == [False, False, True], "ten quiet seconds save up two reads, not twenty"


def test_a_missing_resource_is_not_read_again_so_soon_by_the_same_context() -> None:
    play = book()
    play.step(Subscribe(1, "resource", DOC, ALICE), StartLook(1, "resource", DOC, ALICE, paced=False))
    play.step(Subscribe(2, "resource", DOC, ALICE_PHONE))
    play.step(LookDone(1, 1, GONE), Resolve(1, None), Resolve(2, None))
    assert play.engine.keys() == []
    play.step(Subscribe(3, "resource", DOC, ALICE), Resolve(3, None))
    play.step(Subscribe(4, "resource", DOC, BOB), StartLook(2, "resource", DOC, BOB, paced=False))
    play.at(4.99)
    play.step(Subscribe(5, "resource", DOC, ALICE), Resolve(5, None))
    play.at(5.0)
    play.step(Subscribe(6, "resource", DOC, ALICE), StartLook(3, "resource", DOC, ALICE, paced=False))


def test_a_missing_resource_is_read_again_once_that_context_finds_it_or_the_list_changes() -> None:
    play = book()
    for uri in (DOC, OTHER):
        look = play.feed(Subscribe(1, "resource", uri, ALICE))[0]
        assert isinstance(look, StartLook)
        play.step(LookDone(look.look, 1, GONE), Resolve(1, None))
    found = {"result": {"contents": [{"uri": DOC, "text": "v1"}]}}
    play.step(Forwarded("resources/read", {"uri": DOC}, BOB, found, 2))  # bob's find is not alice's
    play.step(Subscribe(2, "resource", DOC, ALICE), Resolve(2, None))
    play.step(Forwarded("resources/read", {"uri": DOC}, ALICE, found, 3))
    play.step(Subscribe(3, "resource", DOC, ALICE), StartLook(3, "resource", DOC, ALICE, paced=False))
    play.step(Subscribe(4, "resource", OTHER, ALICE), Resolve(4, None))
    listed = ChangeEvent(WatchKey("resources_list", None, "public"), "fp", 1, 0.0)
    play.step(ChangeHeard(listed))
    play.step(Subscribe(5, "resource", OTHER, ALICE), StartLook(4, "resource", OTHER, ALICE, paced=False))


def test_a_failed_first_read_fails_each_waiter_and_leaves_nothing() -> None:
    play = book()
    play.step(Subscribe(1, "resource", DOC, ALICE), StartLook(1, "resource", DOC, ALICE, paced=False))
    play.step(Subscribe(2, "resource", DOC, ALICE_PHONE))
    play.step(LookFailed(1, DOWN), Fail(1, DOWN), Fail(2, DOWN))
    assert play.engine.keys() == [] and play.engine.looks_in_flight == 0
    play.step(Subscribe(3, "resource", DOC, ALICE), StartLook(2, "resource", DOC, ALICE, paced=False))


def test_a_caller_that_leaves_is_dropped_from_its_first_read() -> None:
    play = book()
    play.step(Subscribe(1, "resource", DOC, ALICE), StartLook(1, "resource", DOC, ALICE, paced=False))
    play.step(Subscribe(2, "resource", DOC, ALICE_PHONE))
    play.step(Leave(1))
    watched = key("alice")
    play.step(
        LookDone(1, 1, V1),
        StartWatch(watched, V1, 1),
        SetTimer(-1, play.now + POLL_S),
        PublishFirst(1, watched, V1.fingerprint),
    )
    play.step(Published(1), Track(watched), Cover(ALICE_PHONE, "resource", DOC), Resolve(2, watched))
    assert holders(play, watched) == 1
    play.step(Leave(2))  # answered already: what it holds, it releases
    assert holders(play, watched) == 1


def test_a_first_read_nobody_waits_for_any_more_starts_a_watch_that_lingers() -> None:
    play = book()
    play.step(Subscribe(1, "resource", DOC, ALICE), StartLook(1, "resource", DOC, ALICE, paced=False))
    play.step(Leave(1))
    watched = key("alice")
    play.step(
        LookDone(1, 1, V1),
        StartWatch(watched, V1, 1),
        SetTimer(-1, play.now + POLL_S),
        PublishFirst(1, watched, V1.fingerprint),
    )
    play.at(3.0)
    play.step(Published(1), SetTimer(2, 3.0 + LINGER_S))
    play.at(3.0 + LINGER_S)
    play.step(TimerFired(2), CancelTimer(-1), StopWatch(watched))
    assert play.engine.keys() == []


def test_a_failed_publish_of_a_first_look_fails_its_callers_and_the_watch_lingers() -> None:
    play = book()
    play.step(Subscribe(1, "resource", DOC, ALICE), StartLook(1, "resource", DOC, ALICE, paced=False))
    watched = key("alice")
    play.step(
        LookDone(1, 1, V1),
        StartWatch(watched, V1, 1),
        SetTimer(-1, play.now + POLL_S),
        PublishFirst(1, watched, V1.fingerprint),
    )
    play.step(Published(1, DOWN), Fail(1, DOWN), SetTimer(2, LINGER_S))


@pytest.mark.invariant(16)
def test_joining_a_live_watch_waits_for_a_look_that_starts_after_it_asked() -> None:
    play = book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    # Three more of alice's streams join the live watch at once: they hold it from their asking (it cannot end
    # meanwhile), and everyone joining while the look is in flight shares it. Nobody is answered before it is back.
    play.step(Subscribe(2, "resource", DOC, ALICE), StartLook(2, "resource", DOC, ALICE, paced=False))
    play.step(Subscribe(3, "resource", DOC, ALICE))
    play.step(Subscribe(4, "resource", DOC, ALICE))
    assert holders(play, watched) == 4 and play.engine.looks_in_flight == 1
    play.step(
        LookDone(2, 2, V2),
        Observed(watched, V2.fingerprint, 2),
        Publish(watched, V2.fingerprint, 1),  # the change the look saw is told before the ack
        Resolve(2, watched),
        Resolve(3, watched),
        Resolve(4, watched),
    )
    assert holders(play, watched) == 4 and play.engine.looks_in_flight == 0


def test_a_public_result_is_one_watch_each_context_joins_after_its_own_read() -> None:
    play = book()
    public = started(play, 1, 1, ALICE, PUBLIC_V1, 1)
    # Bob has not proved he may read it: his own read first, which the public watch takes as a look.
    play.step(Subscribe(2, "resource", DOC, BOB), StartLook(2, "resource", DOC, BOB, paced=False))
    play.step(
        LookDone(2, 2, PUBLIC_V2),
        Observed(public, PUBLIC_V2.fingerprint, 2),
        Publish(public, PUBLIC_V2.fingerprint, 1),
        Cover(BOB, "resource", DOC),
        Resolve(2, public),
    )
    # Proved: his next stream joins the watch, with a look that starts after it asked.
    play.step(Subscribe(3, "resource", DOC, BOB), StartLook(3, "resource", DOC, BOB, paced=False))
    assert holders(play, public) == 3


def test_a_first_read_that_finds_a_lingering_watch_restarts_its_linger() -> None:
    play = book()
    public = started(play, 1, 1, ALICE, PUBLIC_V1, 1)
    play.at(1.0)
    play.step(Release(public, "alice"), *_lingering(public, "alice", timer=2, until=1.0 + LINGER_S))
    play.at(7.0)
    play.step(Subscribe(2, "resource", DOC, BOB), StartLook(3, "resource", DOC, BOB, paced=False))
    play.step(Leave(2))
    play.step(
        LookDone(3, 2, PUBLIC_V1),
        Observed(public, PUBLIC_V1.fingerprint, 2),
        CancelTimer(2),
        SetTimer(4, 7.0 + LINGER_S),
    )
    play.at(1.0 + LINGER_S)
    play.step(TimerFired(2))
    play.at(7.0 + LINGER_S)
    play.step(TimerFired(4), CancelTimer(-1), StopWatch(public))


def test_a_first_read_that_finds_a_lingering_watch_gives_it_to_its_callers() -> None:
    play = book()
    public = started(play, 1, 1, ALICE, PUBLIC_V1, 1)
    play.step(Release(public, "alice"), *_lingering(public, "alice", timer=2, until=LINGER_S))
    play.step(Subscribe(2, "resource", DOC, BOB), StartLook(3, "resource", DOC, BOB, paced=False))
    play.step(
        LookDone(3, 2, PUBLIC_V1),
        Observed(public, PUBLIC_V1.fingerprint, 2),
        Track(public),
        CancelTimer(2),
        Cover(BOB, "resource", DOC),
        Resolve(2, public),
    )
    play.at(LINGER_S)
    play.step(TimerFired(2))
    assert holders(play, public) == 1


def _lingering(watched: WatchKey, context: str, *, timer: int, until: float) -> list[object]:
    from sidecar.watch.engine.commands import Uncover, Untrack

    return [Uncover(context, "resource", DOC), Untrack(watched), SetTimer(timer, until)]


def test_the_contexts_watching_are_counted_as_watches_start_and_end() -> None:
    """The `watched_contexts` gauge's figure: a context counts while any of its watches lives (lingering included),
    and once, however many it has."""
    play = book()
    for waiter, (who, uri) in enumerate(((ALICE, DOC), (ALICE, OTHER), (BOB, DOC)), 1):
        play.step(Subscribe(waiter, "resource", uri, who), StartLook(waiter, "resource", uri, who, paced=False))
        play.step(Leave(waiter))  # nobody waits: each watch lingers once its first look is published
        play.feed(LookDone(waiter, waiter, V1))
        assert play.engine.index.contexts == (1 if waiter < 3 else 2)
    lingers = {}
    for waiter, uri_key in enumerate((key("alice"), key("alice", OTHER), key("bob")), 1):
        [linger] = [command for command in play.feed(Published(waiter)) if isinstance(command, SetTimer)]
        lingers[uri_key] = linger.timer
    play.at(LINGER_S)
    play.feed(TimerFired(lingers[key("alice")]))
    assert play.engine.index.contexts == 2, "alice still watches OTHER"
    play.feed(TimerFired(lingers[key("alice", OTHER)]))
    assert play.engine.index.contexts == 1
    play.feed(TimerFired(lingers[key("bob")]))
    assert play.engine.keys() == [] and play.engine.index.contexts == 0
