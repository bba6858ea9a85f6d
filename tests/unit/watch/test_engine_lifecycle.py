"""The engine's watches after their first read, as playbooks: holders come and go, the last one's release
lingers, joiners wait for a look that starts after they asked, and what forwarded requests and other replicas'
changes teach (refusals: test_engine_refusals)."""

from __future__ import annotations

import pytest

from sidecar.changes import ChangeEvent
from sidecar.config import PollingConfig
from sidecar.config.polling_rules import PollingRule
from sidecar.identity import PUBLIC
from sidecar.protocol.errors import UpstreamUnavailable
from sidecar.watch.engine import Engine, Stage
from sidecar.watch.engine.commands import (
    AnnounceWrites,
    CancelTimer,
    Cover,
    Fail,
    Interval,
    Observed,
    Publish,
    PublishFirst,
    Resolve,
    SetTimer,
    StartLook,
    StartPoll,
    StartWatch,
    StopWatch,
    Track,
    Uncover,
    Untrack,
    Waited,
)
from sidecar.watch.engine.events import (
    ChangeHeard,
    Forwarded,
    Hinted,
    Leave,
    LookDone,
    LookFailed,
    PollDone,
    PollFinished,
    PollSkipped,
    Published,
    Release,
    Subscribe,
    TimerFired,
)
from sidecar.watch.fingerprint import ABSENT
from sidecar.watch.observation import Observation
from sidecar.watch.rules import Rules
from tests.unit.watch.engine_cast import (
    ALICE,
    ALICE_PHONE,
    ANON,
    BOB,
    DOC,
    GONE,
    LINGER_S,
    OTHER,
    POLL_S,
    PUBLIC_V1,
    V1,
    V2,
    Book,
    book,
    holders,
    joined,
    key,
    started,
)

DOWN = UpstreamUnavailable("scripted://upstream", "connection refused")


def test_the_last_release_lingers_then_ends() -> None:
    play = book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    play.step(Subscribe(2, "resource", DOC, ALICE_PHONE), StartLook(2, "resource", DOC, ALICE_PHONE, paced=False))
    play.step(LookDone(2, 2, V1), Observed(watched, V1.fingerprint, 2), Resolve(2, watched))
    play.at(1.0)
    play.step(Release(watched, "alice"))  # another of alice's streams holds it still
    play.step(Release(watched, "alice"), Uncover("alice", "resource", DOC), Untrack(watched), SetTimer(3, 9.0))
    record = play.engine.record(watched)
    assert record is not None and record.stage is Stage.LINGERING
    assert play.engine.poller(watched) is None, "no credential to poll with while it lingers"
    play.at(5.0)
    # Its poll comes due while it lingers: the driver finds no credential and skips it (neither success nor failure).
    play.step(TimerFired(-1), StartPoll(watched, 5.0, False))
    play.step(PollSkipped(watched, 5.0))
    play.step(PollFinished(watched), Interval(POLL_S), SetTimer(-2, 10.0))
    play.at(9.0)
    play.step(TimerFired(3), CancelTimer(-2), StopWatch(watched))
    assert play.engine.keys() == [] and record.stage is Stage.ENDED
    play.step(Release(watched, "alice"))  # a release after the end changes nothing
    # An ended watch starts anew: a first read, and a first look published before the caller is answered.
    play.step(Subscribe(4, "resource", DOC, ALICE), StartLook(4, "resource", DOC, ALICE, paced=False))
    play.step(
        LookDone(4, 4, V1),
        StartWatch(watched, V1, 4),
        SetTimer(-3, 9.0 + POLL_S),
        PublishFirst(4, watched, V1.fingerprint),
    )


def test_a_release_while_another_stream_holds_the_watch_keeps_it_live_and_polled() -> None:
    play = book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    play.step(Subscribe(2, "resource", DOC, ALICE), StartLook(2, "resource", DOC, ALICE, paced=False))
    play.step(LookDone(2, 2, V1), Observed(watched, V1.fingerprint, 2), Resolve(2, watched))
    play.step(Release(watched, "alice"))  # the other stream holds it still: no linger, and alice's credential stays
    assert holders(play, watched) == 1 and play.engine.poller(watched) == ALICE
    for n, (timer, at) in enumerate(((-1, 5.0), (-2, 10.0), (-3, 15.0)), 3):
        play.at(at)
        play.step(TimerFired(timer), StartPoll(watched, at, False))
        play.step(PollDone(watched, at, n, V1), Observed(watched, V1.fingerprint, n))
        play.step(PollFinished(watched), Interval(POLL_S), SetTimer(timer - 1, at + POLL_S))
    assert holders(play, watched) == 1


@pytest.mark.invariant(6)
@pytest.mark.invariant(9)
def test_a_watch_polls_a_jittered_interval_after_each_poll_and_tells_a_change_once() -> None:
    # A 25 % jitter, drawn at 0.75: each interval is 5 s * 1.125 (exact in binary); without jitter it would be 5 s.
    engine = Engine(
        linger_s=LINGER_S,
        absent_ttl_s=5.0,
        rate_per_s=1_000.0,
        rules=Rules([]),
        polling=PollingConfig(jitter=0.25),
        rand=lambda: 0.75,
    )
    play = Book(engine)
    interval = 5.625
    watched = key("alice")
    play.step(Subscribe(1, "resource", DOC, ALICE), StartLook(1, "resource", DOC, ALICE, paced=False))
    play.step(
        LookDone(1, 1, V1),
        StartWatch(watched, V1, 1),
        SetTimer(-1, interval),  # the first poll a whole interval after the first read
        PublishFirst(1, watched, V1.fingerprint),
    )
    play.step(Published(1), Track(watched), Cover(ALICE, "resource", DOC), Resolve(1, watched))
    seen = [V1, V2, V2]  # the first poll sees the first look's content: nothing to tell (its baseline is what it read)
    told = [[], [Publish(watched, V2.fingerprint, 1)], []]
    for n in range(3):
        at = interval * (n + 1)
        play.at(at)
        play.step(TimerFired(-1 - n), StartPoll(watched, at, False))
        play.step(PollDone(watched, at, n + 2, seen[n]), Observed(watched, seen[n].fingerprint, n + 2), *told[n])
        play.step(PollFinished(watched), Interval(interval), SetTimer(-2 - n, at + interval))
    record = play.engine.record(watched)
    assert record is not None and record.generation == 1, "told once"


def test_hinted_polls_over_the_hint_budget_are_deferred_to_their_turn() -> None:
    engine = Engine(
        linger_s=LINGER_S,
        absent_ttl_s=5.0,
        rate_per_s=1_000.0,
        rules=Rules([]),
        polling=PollingConfig(max_hinted_polls_per_s=1.0),
        rand=lambda: 0.5,
    )
    play = Book(engine)
    uris = [f"file:///{n}" for n in range(4)]
    watches = []
    for n, uri in enumerate(uris, 1):
        play.feed(Subscribe(n, "resource", uri, ALICE))
        play.feed(LookDone(n, n, PUBLIC_V1))
        play.feed(Published(n))
        watches.append(key(PUBLIC, uri))
    play.at(1.0)
    # A write hints the four at once (warm, as a write's hints are): a burst of the budget's per_s, the rest one a
    # second, each counted as a wait (never dropped).
    play.step(Hinted(watches[0], warm=True), CancelTimer(-1), SetTimer(-5, 1.0))
    for n in (1, 2, 3):
        wait, *armed = play.feed(Hinted(watches[n], warm=True))
        # Its turn comes n seconds on; it was wanted a moment after the first (a burst's hints are jittered).
        assert isinstance(wait, Waited) and wait.limit == "hinted_polls" and wait.seconds == pytest.approx(n - 0.0125)
        assert armed == [CancelTimer(-1 - n), SetTimer(-5 - n, 1.0 + n)], "deferred to its turn, never dropped"
    for n in range(4):
        play.at(1.0 + n)
        play.step(TimerFired(-5 - n), StartPoll(watches[n], 1.0 + n, True))


@pytest.mark.invariant(16)
def test_a_client_coming_back_while_it_lingers_is_answered_after_a_look_that_starts_after_it_asked() -> None:
    play = book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    play.step(Release(watched, "alice"), Uncover("alice", "resource", DOC), Untrack(watched), SetTimer(2, LINGER_S))
    play.at(7.0)
    held = [Track(watched), CancelTimer(2), Cover(ALICE, "resource", DOC)]
    play.step(Subscribe(2, "resource", DOC, ALICE), *held, StartLook(3, "resource", DOC, ALICE, paced=False))
    play.step(Subscribe(3, "resource", DOC, BOB), StartLook(4, "resource", DOC, BOB, paced=False))  # not verified
    play.step(Subscribe(4, "resource", DOC, ALICE_PHONE))  # shares the look in flight
    play.at(LINGER_S)
    play.step(TimerFired(2))  # called off: it does not end a watch held again
    play.step(
        LookDone(3, 5, V2),
        Observed(watched, V2.fingerprint, 5),
        Publish(watched, V2.fingerprint, 1),
        Resolve(2, watched),
        Resolve(4, watched),
    )
    assert holders(play, watched) == 2
    assert play.engine.poller(watched) == ALICE, "live again: polled with the credential of the client that came back"


def test_joiners_of_two_watches_at_once_each_wait_for_a_look_at_their_own() -> None:
    play = book()
    doc = started(play, 1, 1, ALICE, V1, 1)
    other = key("alice", OTHER)
    play.step(Subscribe(2, "resource", OTHER, ALICE), StartLook(2, "resource", OTHER, ALICE, paced=False))
    play.step(
        LookDone(2, 2, V1),
        StartWatch(other, V1, 2),
        SetTimer(-2, play.now + POLL_S),
        PublishFirst(2, other, V1.fingerprint),
    )
    play.step(Published(2), Track(other), Cover(ALICE, "resource", OTHER), Resolve(2, other))
    play.step(Subscribe(3, "resource", DOC, ALICE_PHONE), StartLook(3, "resource", DOC, ALICE_PHONE, paced=False))
    play.step(Subscribe(4, "resource", OTHER, ALICE_PHONE), StartLook(4, "resource", OTHER, ALICE_PHONE, paced=False))
    play.step(
        LookDone(4, 4, V2), Observed(other, V2.fingerprint, 4), Publish(other, V2.fingerprint, 1), Resolve(4, other)
    )
    play.step(LookDone(3, 3, V1), Observed(doc, V1.fingerprint, 3), Resolve(3, doc))


def test_contexts_joining_a_public_watch_share_a_look_once_each_proved_access() -> None:
    play = book()
    public = started(play, 1, 1, ALICE, PUBLIC_V1, 1)
    joined(play, 2, BOB, public, 2)
    play.step(Subscribe(3, "resource", DOC, ALICE_PHONE), StartLook(3, "resource", DOC, ALICE_PHONE, paced=False))
    play.step(Subscribe(4, "resource", DOC, BOB))
    play.step(
        LookDone(3, 3, PUBLIC_V1), Observed(public, PUBLIC_V1.fingerprint, 3), Resolve(3, public), Resolve(4, public)
    )


def test_a_joiner_whose_look_finds_the_resource_gone_gets_nothing_and_holds_nothing() -> None:
    play = book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    play.step(Subscribe(2, "resource", DOC, BOB), StartLook(2, "resource", DOC, BOB, paced=False))
    play.step(LookDone(2, 2, GONE), Resolve(2, None))  # bob's own first read: nothing there for him
    play.step(Release(watched, "alice"), Uncover("alice", "resource", DOC), Untrack(watched), SetTimer(3, LINGER_S))
    play.step(Subscribe(3, "resource", DOC, ALICE), Track(watched), CancelTimer(3), Cover(ALICE, "resource", DOC),
              StartLook(4, "resource", DOC, ALICE, paced=False))  # fmt: skip
    play.step(
        LookDone(4, 3, GONE),
        Observed(watched, GONE.fingerprint, 3),
        Publish(watched, GONE.fingerprint, 1),
        Uncover("alice", "resource", DOC),
        Untrack(watched),
        SetTimer(5, LINGER_S),
        Resolve(3, None),
    )


def test_a_joiner_whose_look_finds_it_gone_lets_go_while_the_streams_watching_it_are_told() -> None:
    play = book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    play.step(Subscribe(2, "resource", DOC, ALICE_PHONE), StartLook(2, "resource", DOC, ALICE_PHONE, paced=False))
    assert holders(play, watched) == 2
    play.step(
        LookDone(2, 2, GONE),
        Observed(watched, GONE.fingerprint, 2),
        Publish(watched, GONE.fingerprint, 1),  # the stream already watching it is told it is gone
        Resolve(2, None),
    )
    assert holders(play, watched) == 1, "the joiner holds nothing; the first stream still holds it"
    play.step(Release(watched, "alice"), Uncover("alice", "resource", DOC), Untrack(watched), SetTimer(3, LINGER_S))
    play.at(LINGER_S)
    play.step(TimerFired(3), CancelTimer(-1), StopWatch(watched))


def test_a_joiner_that_leaves_or_whose_look_fails_lets_go_of_the_watch() -> None:
    play = book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    play.step(Subscribe(2, "resource", DOC, ALICE_PHONE), StartLook(2, "resource", DOC, ALICE_PHONE, paced=False))
    play.step(Subscribe(3, "resource", DOC, ALICE))
    assert holders(play, watched) == 3
    play.step(Leave(2))
    assert holders(play, watched) == 2
    play.step(LookFailed(2, DOWN), Fail(3, DOWN))
    assert holders(play, watched) == 1
    play.step(Leave(3))  # answered already
    play.step(Release(watched, "alice"), Uncover("alice", "resource", DOC), Untrack(watched), SetTimer(3, LINGER_S))


def test_a_joiners_look_comes_back_after_its_watch_ended_and_applies_to_nothing() -> None:
    play = book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    play.step(Subscribe(2, "resource", DOC, ALICE), StartLook(2, "resource", DOC, ALICE, paced=False))
    play.step(Release(watched, "alice"))
    play.step(Leave(2), Uncover("alice", "resource", DOC), Untrack(watched), SetTimer(3, LINGER_S))
    play.at(LINGER_S)
    play.step(TimerFired(3), CancelTimer(-1), StopWatch(watched))
    play.step(LookDone(2, 5, V2))


def test_a_joiners_look_over_its_clients_rate_is_paced() -> None:
    play = book(rate_per_s=1)
    watched = started(play, 1, 1, ALICE, V1, 1)
    play.step(Subscribe(2, "resource", DOC, ALICE), StartLook(2, "resource", DOC, ALICE, paced=True))
    play.step(Subscribe(3, "resource", DOC, ALICE))  # the laptop's second join shares its paced look
    play.step(Subscribe(4, "resource", DOC, ALICE_PHONE), StartLook(3, "resource", DOC, ALICE_PHONE, paced=False))
    assert holders(play, watched) == 4
    play.step(LookDone(2, 3, V1), Observed(watched, V1.fingerprint, 3), Resolve(2, watched), Resolve(3, watched))


def test_a_public_watch_is_polled_anonymously_when_it_can_and_else_with_a_holders_credential() -> None:
    play = book()
    public = started(play, 1, 1, BOB, PUBLIC_V1, 1)
    assert play.engine.poller(public) == BOB
    play.step(Subscribe(2, "resource", DOC, ANON), StartLook(2, "resource", DOC, ANON, paced=False))
    play.step(
        LookDone(2, 2, PUBLIC_V1),
        Observed(public, PUBLIC_V1.fingerprint, 2),
        Cover(ANON, "resource", DOC),
        Resolve(2, public),
    )
    assert play.engine.poller(public) == ANON
    play.step(Subscribe(3, "resource", DOC, ALICE), StartLook(3, "resource", DOC, ALICE, paced=False))
    play.step(
        LookDone(3, 3, PUBLIC_V1),
        Observed(public, PUBLIC_V1.fingerprint, 3),
        Cover(ALICE, "resource", DOC),
        Resolve(3, public),
    )
    play.step(Release(public, ANON.context), Uncover(ANON.context, "resource", DOC))
    play.step(Release(public, "alice"), Uncover("alice", "resource", DOC))
    assert play.engine.poller(public) == BOB, "the credentials of contexts that left are not used"


def test_forwarded_reads_are_looks_at_the_watches_they_concern_and_writes_are_hints() -> None:
    play = book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    result = {"contents": [{"uri": DOC, "text": "v2"}]}
    seen = play.feed(Forwarded("resources/read", {"uri": DOC}, ALICE, {"result": result}, 5))
    applied, told = seen
    assert isinstance(applied, Observed) and (applied.key, applied.ticket) == (watched, 5)
    assert applied.fingerprint not in (V1.fingerprint, ABSENT)
    assert told == Publish(watched, applied.fingerprint, 1), "a read that shows new content is a change"
    play.step(Forwarded("resources/read", {"uri": DOC}, BOB, {"result": result}, 6))  # not bob's watch
    play.step(Forwarded("resources/read", {"uri": OTHER}, ALICE, {"result": result}, 7))
    deep: object = "leaf"
    for _ in range(300):  # orjson writes 254 levels at most: no fingerprint, so nothing learnt
        deep = [deep]
    play.step(Forwarded("resources/read", {"uri": DOC}, ALICE, {"result": {"contents": deep}}, 8))
    not_found = {"error": {"code": -32002, "message": "Resource not found"}}
    play.step(
        Forwarded("resources/read", {"uri": DOC}, ALICE, not_found, 9),
        Observed(watched, GONE.fingerprint, 9),
        Publish(watched, GONE.fingerprint, 2),
    )
    play.step(Forwarded("resources/read", {"uri": DOC}, ALICE, {"error": {"code": -32603}}, 10))
    invalid = {"error": {"code": -32602, "message": "Resource not found"}}  # the other not-found code
    play.step(Forwarded("resources/read", {"uri": DOC}, ALICE, invalid, 10), Observed(watched, GONE.fingerprint, 10))
    # A write is a round of hints (its window opened, the other replicas told): bob watches nothing here.
    write = Forwarded("tools/call", {"name": "edit"}, BOB, {"result": {}}, 11)
    play.step(write, SetTimer(2, 0.01), AnnounceWrites(frozenset({"bob"})))
    play.step(Forwarded("resources/list", {}, BOB, {"result": {}}, 12))
    # Other reads that name the URI show no content of it (a legacy subscribe's empty result is no new content).
    play.step(Forwarded("resources/subscribe", {"uri": DOC}, ALICE, {"result": {}}, 13))
    play.step(Forwarded("prompts/get", {"name": "p", "uri": DOC}, ALICE, {"result": result}, 14))


def test_a_forwarded_read_is_fingerprinted_under_its_uris_rule() -> None:
    ignoring = PollingRule.model_validate({"match": DOC, "ignore": {"json_pointers": ["/generatedAt"]}})
    play = Book(
        Engine(linger_s=LINGER_S, absent_ttl_s=5.0, rate_per_s=1_000.0, rules=Rules([ignoring]), rand=lambda: 0.5)
    )
    watched = started(play, 1, 1, ALICE, V1, 1)

    def read(text: str) -> dict[str, object]:
        return {"result": {"contents": [{"uri": DOC, "text": text}]}}

    first = play.feed(Forwarded("resources/read", {"uri": DOC}, ALICE, read('{"n": 1, "generatedAt": 1}'), 5))
    noise = play.feed(Forwarded("resources/read", {"uri": DOC}, ALICE, read('{"n": 1, "generatedAt": 2}'), 6))
    real = play.feed(Forwarded("resources/read", {"uri": DOC}, ALICE, read('{"n": 2, "generatedAt": 2}'), 7))
    seen = [command for command in first + noise + real if isinstance(command, Observed)]
    assert [command.key for command in seen] == [watched] * 3
    fingerprints = [command.fingerprint for command in seen]
    assert fingerprints[0] == fingerprints[1] != fingerprints[2], "only what the rule does not ignore is a change"
    told = [command for command in first + noise + real if isinstance(command, Publish)]
    assert told == [Publish(watched, fingerprints[0], 1), Publish(watched, fingerprints[2], 2)]


def test_a_forwarded_public_read_is_evidence_for_the_public_watch_but_a_not_found_is_not() -> None:
    play = book()
    public = started(play, 1, 1, ALICE, PUBLIC_V1, 1)
    result = {"contents": [{"uri": DOC, "text": "v2"}], "cacheScope": "public"}
    seen = play.feed(Forwarded("resources/read", {"uri": DOC}, BOB, {"result": result}, 5))
    assert [type(command) for command in seen] == [Observed, Publish] and seen[0].key == public  # type: ignore[union-attr]
    not_found = {"error": {"code": -32602, "message": "Resource not found"}}
    play.step(Forwarded("resources/read", {"uri": DOC}, BOB, not_found, 6))
    play.step(Forwarded("resources/read", {"uri": DOC}, ALICE, not_found, 7))


def test_changes_heard_on_the_bus_are_adopted_by_the_watches_here_but_first_looks_are_not() -> None:
    play = book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    play.step(ChangeHeard(ChangeEvent(watched, "fp-v2", 1, 0.0)))  # taken as its own: nobody is told again
    record = play.engine.record(watched)
    assert record is not None and (record.fingerprint, record.generation) == ("fp-v2", 1)
    play.step(ChangeHeard(ChangeEvent(watched, "fp-v3", 0, 0.0, baseline=True)))
    play.step(ChangeHeard(ChangeEvent(key("bob"), "fp-v3", 1, 0.0)))
    assert (record.fingerprint, record.generation) == ("fp-v2", 1)
    # A look that then sees what was adopted is no change; one that sees more is the next.
    play.step(Subscribe(2, "resource", DOC, ALICE_PHONE), StartLook(2, "resource", DOC, ALICE_PHONE, paced=False))
    play.step(LookDone(2, 2, Observation("fp-v2", None, False)), Observed(watched, "fp-v2", 2), Resolve(2, watched))
    play.step(Subscribe(3, "resource", DOC, ALICE_PHONE), StartLook(3, "resource", DOC, ALICE_PHONE, paced=False))
    play.step(
        LookDone(3, 3, Observation("fp-v3", None, False)),
        Observed(watched, "fp-v3", 3),
        Publish(watched, "fp-v3", 2),
        Resolve(3, watched),
    )


@pytest.mark.invariant(10)
def test_a_private_result_is_watched_per_context() -> None:
    play = book()
    alices = started(play, 1, 1, ALICE, V1, 1)
    play.step(Subscribe(2, "resource", DOC, BOB), StartLook(2, "resource", DOC, BOB, paced=False))
    bobs = key("bob")
    assert bobs != alices and bobs.context != PUBLIC
    commands = play.feed(LookDone(2, 2, Observation("fp-bob", None, False)))
    assert [getattr(command, "key", None) for command in commands] == [bobs, None, bobs]  # its first poll's timer
    play.step(Published(2), Track(bobs), Cover(BOB, "resource", DOC), Resolve(2, bobs))
    assert (play.engine.poller(alices), play.engine.poller(bobs)) == (ALICE, BOB), "each with its own credential"
    play.at(POLL_S)
    play.step(TimerFired(-1), StartPoll(alices, POLL_S, False))
    play.step(TimerFired(-2), StartPoll(bobs, POLL_S, False))
    edited = Observation("fp-bob-edited", None, False)
    play.step(PollDone(alices, POLL_S, 3, V1), Observed(alices, V1.fingerprint, 3))
    play.step(
        PollDone(bobs, POLL_S, 4, edited),
        Observed(bobs, edited.fingerprint, 4),
        Publish(bobs, edited.fingerprint, 1),  # bob's edit is told on bob's watch only
    )
