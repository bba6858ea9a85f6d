"""The engine's refusals, as playbooks: a credential the upstream refused (401/403), on a poll or on a forwarded
read, ends the subscriptions of the one context it belongs to (`Revoke`), which must prove access again with a
read of its own before it rejoins; a refusal for a watch that is gone concerns nobody. (That `Revoke` reaches the
streams, and that a refused poll names its poller's context, is the driver's: tests/integration/auth.)"""

from __future__ import annotations

from sidecar.protocol.errors import UpstreamUnavailable
from sidecar.watch.engine.commands import (
    CancelTimer,
    Cover,
    Fail,
    Observed,
    PublishFirst,
    Resolve,
    Revoke,
    SetTimer,
    StartLook,
    StartPoll,
    StartWatch,
    StopWatch,
    Track,
    Uncover,
    Untrack,
)
from sidecar.watch.engine.events import (
    LookDone,
    LookFailed,
    PollFailed,
    PollFinished,
    Published,
    Refused,
    Release,
    Subscribe,
    TimerFired,
)
from tests.unit.watch.engine_cast import (
    ALICE,
    BOB,
    DOC,
    LINGER_S,
    OTHER,
    POLL_S,
    PUBLIC_V1,
    V1,
    book,
    holders,
    joined,
    key,
    started,
)

DOWN = UpstreamUnavailable("scripted://upstream", "connection refused")


def test_a_refused_poll_of_a_public_watch_concerns_only_the_context_it_was_polled_as() -> None:
    play = book()
    public = started(play, 1, 1, BOB, PUBLIC_V1, 1)
    joined(play, 2, ALICE, public, 2)
    bobs = key("bob", OTHER)
    play.step(Subscribe(3, "resource", OTHER, BOB), StartLook(3, "resource", OTHER, BOB, paced=False))
    play.step(LookDone(3, 3, V1), StartWatch(bobs, V1, 3), SetTimer(-2, POLL_S), PublishFirst(3, bobs, V1.fingerprint))
    play.step(Published(3), Track(bobs), Cover(BOB, "resource", OTHER), Resolve(3, bobs))
    assert play.engine.poller(public) == BOB, "the public watch is polled with the credential of who came first"
    play.at(POLL_S)
    play.step(TimerFired(-1), StartPoll(public, POLL_S, False))
    play.step(TimerFired(-2), StartPoll(bobs, POLL_S, False))
    # Both refused bob's credential: his subscriptions to each end, and alice's to the public watch do not.
    play.step(PollFailed(public, POLL_S, refused="bob"), Revoke(public, "bob"))
    play.step(PollFailed(bobs, POLL_S, refused="bob"), Revoke(bobs, "bob"))
    play.step(PollFinished(public), SetTimer(-3, POLL_S + 1.0))  # each backs off (1 s), as a failed poll does
    play.step(PollFinished(bobs), SetTimer(-4, POLL_S + 1.0))
    # Bob proves access again with a read of his own; alice, still verified, joins with a look that syncs her.
    play.step(Subscribe(4, "resource", DOC, BOB), StartLook(4, "resource", DOC, BOB, paced=False))
    assert holders(play, public) == 2, "not a joiner: bob holds nothing more before his read succeeds"
    play.step(Subscribe(5, "resource", DOC, ALICE), StartLook(5, "resource", DOC, ALICE, paced=False))
    assert holders(play, public) == 3, "a joiner: alice holds it from her asking"
    play.step(LookDone(4, 4, PUBLIC_V1), Observed(public, PUBLIC_V1.fingerprint, 4), Resolve(4, public))
    play.step(LookDone(5, 5, PUBLIC_V1), Observed(public, PUBLIC_V1.fingerprint, 5), Resolve(5, public))
    # A forwarded read the upstream refused ends that context's subscriptions too; other refusals concern none.
    play.step(Refused("resources/read", {"uri": DOC}, BOB), Revoke(public, "bob"))
    play.step(Refused("tools/call", {"uri": DOC}, BOB))
    play.step(Refused("resources/read", {"uri": 7}, BOB))


def test_a_poll_refused_after_its_watch_ended_ends_no_contexts_subscriptions() -> None:
    play = book()
    public = started(play, 1, 1, ALICE, PUBLIC_V1, 1)
    play.at(POLL_S)
    play.step(TimerFired(-1), StartPoll(public, POLL_S, False))  # polled as alice, and held by the upstream
    lingers = [Uncover("alice", "resource", DOC), Untrack(public), SetTimer(2, POLL_S + LINGER_S)]
    play.step(Release(public, "alice"), *lingers)
    play.at(POLL_S + LINGER_S)
    play.step(TimerFired(2), StopWatch(public))  # the linger ends the watch: the poll outlives it
    assert play.engine.keys() == []
    play.step(PollFailed(public, POLL_S, refused="alice"))  # a refusal for a watch that is gone concerns nobody
    play.step(PollFinished(public))  # and nothing is armed after it
    assert play.engine.keys() == [] and play.engine.record(public) is None


def test_a_refused_forwarded_read_ends_that_contexts_subscriptions_and_it_must_read_again() -> None:
    play = book()
    public = started(play, 1, 1, ALICE, PUBLIC_V1, 1)
    joined(play, 2, BOB, public, 2)
    play.step(Refused("resources/read", {"uri": DOC}, BOB), Revoke(public, "bob"))
    play.step(Refused("resources/read", {"uri": OTHER}, BOB))
    play.step(Refused("tools/call", {"uri": DOC}, BOB))
    play.step(Subscribe(3, "resource", DOC, BOB), StartLook(3, "resource", DOC, BOB, paced=False))  # a read of its own
    assert holders(play, public) == 2


def test_a_refused_poll_concerns_only_the_context_it_was_polled_as() -> None:
    play = book()
    public = started(play, 1, 1, ALICE, PUBLIC_V1, 1)
    assert play.engine.poller(public) == ALICE
    play.step(PollFailed(public, 0.0, refused="alice"), Revoke(public, "alice"))
    play.step(Subscribe(2, "resource", DOC, ALICE), StartLook(2, "resource", DOC, ALICE, paced=False))
    play.step(LookDone(2, 2, PUBLIC_V1), Observed(public, PUBLIC_V1.fingerprint, 2), Resolve(2, public))
    private = started(play, 3, 3, BOB, V1, 3)
    play.step(PollFailed(private, 0.0, refused="bob"), Revoke(private, "bob"))
    play.step(Release(private, "bob"), Uncover("bob", "resource", DOC), Untrack(private), SetTimer(4, LINGER_S))
    play.at(LINGER_S)
    play.step(TimerFired(4), CancelTimer(-2), StopWatch(private))
    play.step(PollFailed(private, 0.0, refused="bob"))  # after its watch ended: no context's streams end


def test_a_context_whose_poll_was_refused_holds_nothing_again_until_its_own_read_succeeds() -> None:
    play = book()
    public = started(play, 1, 1, ALICE, PUBLIC_V1, 1)
    assert play.engine.poller(public) == ALICE
    play.step(PollFailed(public, 0.0, refused="alice"), Revoke(public, "alice"))
    play.step(Release(public, "alice"), Uncover("alice", "resource", DOC), Untrack(public), SetTimer(2, LINGER_S))
    # Not a joiner: its credential is neither kept nor polled with, nor the linger cut short, before it proves access.
    play.step(Subscribe(2, "resource", DOC, ALICE), StartLook(3, "resource", DOC, ALICE, paced=False))
    play.step(LookFailed(3, DOWN), Fail(2, DOWN))
    assert holders(play, public) == 0 and play.engine.poller(public) is None
