"""The Redis bus's fence as playbooks: which generation of a key this replica knows, and so which change heard,
stored or refused it delivers, adopts or publishes again."""

from __future__ import annotations

from sidecar.bus.commands import Adopt, Deliver, Poll, Republish
from sidecar.bus.events import ChangeHeard, Fenced, FenceRefused, StoredRead, TakenOver, Untracked
from sidecar.changes import ChangeEvent
from tests.unit.bus.machine_cast import ME, PEER, book, key_won_by

KEY = key_won_by(ME, PEER)
V1, V2, V3 = "fp-1", "fp-2", "fp-3"


def _change(fingerprint: str, generation: int, now: float = 1_000.0, *, baseline: bool = False) -> ChangeEvent:
    return ChangeEvent(KEY, fingerprint, generation, now, baseline=baseline)


# -- changes heard ---------------------------------------------------------------------------------------------


def test_a_change_heard_for_a_watched_key_is_delivered_unless_our_streams_have_it_and_its_generation_is_learnt() -> (
    None
):
    play = book()
    play.step(ChangeHeard(_change(V2, 3), ours=V1), Deliver(_change(V2, 3)))
    assert play.engine.known(KEY) == 3
    play.step(ChangeHeard(_change(V2, 4), ours=V2))  # our watch saw it first: not news here
    assert play.engine.known(KEY) == 4
    play.step(ChangeHeard(_change(V3, 2), ours=V2), Deliver(_change(V3, 2)))  # late: told, never lowers the fence
    assert play.engine.known(KEY) == 4


def test_the_first_change_heard_teaches_its_generation_whatever_it_is() -> None:
    play = book()
    play.step(ChangeHeard(_change(V2, 0), ours=V1), Deliver(_change(V2, 0)))
    assert play.engine.known(KEY) == 0


def test_a_change_heard_for_a_key_not_watched_here_is_delivered_and_teaches_no_fence() -> None:
    play = book()
    play.step(ChangeHeard(_change(V2, 3), ours=None), Deliver(_change(V2, 3)))
    assert play.engine.known(KEY) is None


def test_a_first_look_heard_is_delivered_for_the_caches_and_is_no_generation() -> None:
    play = book()
    baseline = _change(V1, 0, baseline=True)
    play.step(ChangeHeard(baseline, ours=V1), Deliver(baseline))
    assert play.engine.known(KEY) is None


# -- a key taken over ------------------------------------------------------------------------------------------


def test_a_new_owner_that_missed_a_change_adopts_it_and_tells_its_streams() -> None:
    play = book()
    play.feed(ChangeHeard(_change(V1, 1), ours=V1))
    play.step(StoredRead(KEY, V2, 2, ours=V1, taking_over=True), Adopt(_change(V2, 2), tell=True))
    assert play.engine.known(KEY) == 2
    play.step(TakenOver(KEY, 2), Poll(KEY))


def test_a_new_owner_whose_streams_saw_newer_content_publishes_it_on_the_stored_generation() -> None:
    play = book()
    play.feed(ChangeHeard(_change(V1, 2), ours=V1))
    play.feed(ChangeHeard(_change(V2, 2), ours=V3))  # a joiner's first look saw V3 after the last change told
    play.step(StoredRead(KEY, V2, 2, ours=V3, taking_over=True), Republish(_change(V3, 2)))
    play.step(TakenOver(KEY, 2), Poll(KEY))


def test_a_new_owner_that_knew_no_generation_adopts_the_first_change_stored() -> None:
    play = book()
    play.step(StoredRead(KEY, V2, 1, ours=V1, taking_over=True), Adopt(_change(V2, 1), tell=True))


def test_a_new_owner_keeps_the_newest_generation_it_knows() -> None:
    play = book()
    play.feed(ChangeHeard(_change(V2, 5), ours=V2))
    play.step(TakenOver(KEY, 3), Poll(KEY))
    assert play.engine.known(KEY) == 5
    play = book()
    play.step(TakenOver(KEY, 0), Poll(KEY))  # a stored first look: generation 0
    assert play.engine.known(KEY) == 0


def test_a_new_owner_that_has_what_is_stored_only_polls() -> None:
    play = book()
    play.step(StoredRead(KEY, V2, 5, ours=V2, taking_over=True))
    play.step(TakenOver(KEY, 5), Poll(KEY))
    assert play.engine.known(KEY) == 5


def test_a_key_nobody_told_yet_is_polled_and_its_fence_is_learnt_by_its_interest_write() -> None:
    play = book()
    play.step(StoredRead(KEY, None, 0, ours=V1, taking_over=True))
    play.step(TakenOver(KEY, None), Poll(KEY))
    assert play.engine.known(KEY) is None  # so its first interest write is a first write, not a catch-up
    play.step(StoredRead(KEY, V2, 3, ours=V1, taking_over=False))
    assert play.engine.known(KEY) == 3


# -- caught up after our interest is written again ------------------------------------------------------------


def test_a_change_told_while_this_replica_was_not_listening_is_adopted_when_its_interest_is_written_again() -> None:
    play = book()
    play.step(StoredRead(KEY, V1, 1, ours=V1, taking_over=False))  # the first write: learns the generation
    play.step(StoredRead(KEY, V1, 1, ours=V1, taking_over=False))  # nothing newer
    play.step(StoredRead(KEY, V2, 2, ours=V1, taking_over=False), Adopt(_change(V2, 2), tell=True))
    play.step(StoredRead(KEY, V2, 2, ours=V2, taking_over=False))
    play.step(StoredRead(KEY, V3, 3, ours=V3, taking_over=False))  # our streams have it already
    play.step(StoredRead(KEY, V1, 4, ours=None, taking_over=False))  # given up meanwhile
    assert play.engine.known(KEY) == 4


def test_a_stored_change_no_newer_than_the_generation_known_is_not_adopted_again() -> None:
    play = book()
    play.feed(ChangeHeard(_change(V2, 3), ours=V3))
    play.step(StoredRead(KEY, V2, 2, ours=V1, taking_over=False))  # older than what was heard
    play.step(StoredRead(KEY, V2, 3, ours=V1, taking_over=False))  # the one heard: told then
    assert play.engine.known(KEY) == 3


def test_a_first_interest_write_learns_even_a_first_look_s_generation() -> None:
    play = book()
    play.step(StoredRead(KEY, V1, 0, ours=V2, taking_over=False))
    assert play.engine.known(KEY) == 0


def test_a_key_given_up_starts_afresh_when_watched_again() -> None:
    play = book()
    play.feed(StoredRead(KEY, V1, 1, ours=V1, taking_over=False))
    play.step(Untracked(KEY))
    assert play.engine.known(KEY) is None
    play.step(StoredRead(KEY, V2, 2, ours=V3, taking_over=False))  # a first write again: its own look is newer


# -- the fenced publish ----------------------------------------------------------------------------------------


def test_a_fenced_publish_records_the_generation_it_was_answered_with() -> None:
    play = book()
    play.step(Fenced(KEY, 7))
    assert play.engine.known(KEY) == 7


def test_a_fresh_look_refused_for_good_takes_the_stored_fingerprint_without_telling_its_streams_again() -> None:
    play = book()
    play.step(FenceRefused(KEY, V2, 4, ours=V1, fresh=True), Adopt(_change(V2, 4), tell=False))


def test_an_older_change_published_again_and_refused_tells_its_streams_what_is_stored() -> None:
    play = book()
    play.step(FenceRefused(KEY, V2, 4, ours=V1, fresh=False), Adopt(_change(V2, 4), tell=True))


def test_a_refusal_for_a_key_given_up_or_already_holding_the_stored_fingerprint_asks_nothing() -> None:
    play = book()
    play.step(FenceRefused(KEY, V2, 4, ours=None, fresh=False))
    play.step(FenceRefused(KEY, V2, 4, ours=V2, fresh=False))
    play.step(FenceRefused(KEY, None, 4, ours=V1, fresh=False))
