"""The Redis bus's rules for membership, ownership (so take-over) and interest routing, as playbooks: what each
heartbeat read, interest message and interest write asks this replica to do."""

from __future__ import annotations

from sidecar.bus.commands import CleanUp, Forgotten, GaveUp, Moved, RegisterAgain
from sidecar.bus.events import (
    Beat,
    CleanUpEnded,
    CutChanged,
    InterestHeard,
    InterestRemoved,
    OursQueued,
    OursWritten,
    ReplicaLeft,
    Untracked,
)
from sidecar.bus.layout import key_hash
from tests.unit.bus.machine_cast import ME, PEER, THIRD, Book, book, key_won_by

NOBODY: frozenset[str] = frozenset()


def _watching(play: Book, hashed: str, *others: str) -> None:
    """Our interest in the key is written, with `others` interested too; we own it when we win it."""
    play.feed(OursQueued(hashed))
    play.feed(OursWritten(hashed, frozenset(others)))


# -- membership ------------------------------------------------------------------------------------------------


def test_each_dead_replica_is_cleaned_up_once_at_a_time_and_again_after_a_clean_up_cut_short() -> None:
    play = book()
    play.step(Beat(frozenset({ME, PEER}), (THIRD,), listed_again=True), CleanUp(THIRD))
    play.at(1_001).step(Beat(frozenset({ME, PEER}), (THIRD,), listed_again=False))  # its clean-up still runs
    play.step(CleanUpEnded(THIRD))  # cut short: nothing removed
    play.at(1_002).step(Beat(frozenset({ME, PEER}), (THIRD,), listed_again=False), CleanUp(THIRD))


def test_a_replica_listed_again_after_it_had_beaten_registers_its_interest_again() -> None:
    play = book()
    play.step(Beat(frozenset({ME}), (), listed_again=True))  # the first beat lists us: joining, not a return
    play.at(1_001).step(Beat(frozenset({ME}), (), listed_again=False))
    play.at(1_010).step(Beat(frozenset({ME}), (), listed_again=True), RegisterAgain())


def test_a_replica_taken_for_dead_registers_again_before_the_keys_it_regains_are_taken_over() -> None:
    theirs = key_won_by(PEER, ME)
    play = book()
    play.feed(Beat(frozenset({ME, PEER}), (), listed_again=True))
    _watching(play, key_hash(theirs), PEER)
    play.at(1_010).step(
        Beat(frozenset({ME}), (PEER,), listed_again=True),
        RegisterAgain(),
        Moved(frozenset({key_hash(theirs)}), NOBODY),
        CleanUp(PEER),
    )


def test_keys_of_a_replica_whose_heartbeat_stopped_move_to_the_interested_live_ones() -> None:
    theirs = key_won_by(PEER, ME)
    play = book()
    play.feed(Beat(frozenset({ME, PEER}), (), listed_again=True))
    _watching(play, key_hash(theirs), PEER)
    assert not play.engine.owns(key_hash(theirs))
    play.at(1_005).step(
        Beat(frozenset({ME}), (PEER,), listed_again=False), Moved(frozenset({key_hash(theirs)}), NOBODY), CleanUp(PEER)
    )
    assert play.engine.owns(key_hash(theirs))


def test_a_dead_replica_cleaned_up_is_forgotten_and_wins_nothing_until_its_interest_is_heard_again() -> None:
    theirs = key_won_by(PEER, ME)
    hashed = key_hash(theirs)
    play = book()
    play.feed(Beat(frozenset({ME, PEER}), (), listed_again=True))
    _watching(play, hashed, PEER)
    play.at(1_005).feed(Beat(frozenset({ME}), (PEER,), listed_again=False))
    play.step(InterestRemoved(PEER), Forgotten(PEER))
    play.step(CleanUpEnded(PEER))
    # It comes back (a restart under its name): live, but with none of its interest until it writes it again.
    play.at(1_010).step(Beat(frozenset({ME, PEER}), (), listed_again=False))
    assert play.engine.owns(hashed)
    play.step(InterestHeard(hashed, PEER, True), Moved(NOBODY, frozenset({hashed})))


def test_a_replica_that_says_it_left_hands_its_keys_over_at_once() -> None:
    theirs = key_won_by(PEER, ME)
    play = book()
    play.feed(Beat(frozenset({ME, PEER}), (), listed_again=True))
    _watching(play, key_hash(theirs), PEER)
    play.step(ReplicaLeft(PEER), Moved(frozenset({key_hash(theirs)}), NOBODY))
    assert play.engine.live == {ME}


def test_this_replica_counts_as_live_whatever_a_heartbeat_says() -> None:
    ours = key_won_by(ME, PEER)
    play = book()
    _watching(play, key_hash(ours))
    play.step(Beat(frozenset({PEER}), (), listed_again=False))  # our own entry missing from a late read
    assert play.engine.owns(key_hash(ours))
    assert play.engine.live == {ME, PEER}


# -- ownership -------------------------------------------------------------------------------------------------


def test_a_key_is_owned_by_the_interested_live_replica_that_wins_it_and_moves_as_interest_comes_and_goes() -> None:
    theirs = key_won_by(PEER, ME)
    hashed = key_hash(theirs)
    play = book()
    play.feed(Beat(frozenset({ME, PEER}), (), listed_again=True))
    play.feed(OursQueued(hashed))
    play.step(OursWritten(hashed, NOBODY), Moved(frozenset({hashed}), NOBODY))  # alone interested
    assert play.engine.owned_count == 1
    play.step(InterestHeard(hashed, PEER, True), Moved(NOBODY, frozenset({hashed})))
    play.step(InterestHeard(hashed, PEER, True))  # heard twice: nothing moves
    play.step(InterestHeard(hashed, PEER, False), Moved(frozenset({hashed}), NOBODY))


def test_interest_of_a_replica_not_live_does_not_win_a_key() -> None:
    theirs = key_won_by(PEER, ME)
    play = book()
    play.feed(Beat(frozenset({ME}), (), listed_again=True))
    play.feed(OursQueued(key_hash(theirs)))
    play.step(OursWritten(key_hash(theirs), frozenset({PEER})), Moved(frozenset({key_hash(theirs)}), NOBODY))


def test_interest_heard_in_a_key_this_replica_does_not_watch_moves_nothing() -> None:
    play = book()
    play.step(InterestHeard(key_hash(key_won_by(PEER, ME)), PEER, True))
    play.step(InterestHeard(key_hash(key_won_by(ME, PEER)), PEER, False))
    assert play.engine.owned_count == 0


def test_a_key_given_up_is_polled_no_more_and_that_is_no_loss_of_ownership() -> None:
    ours, theirs = key_won_by(ME, PEER), key_won_by(PEER, ME)
    play = book()
    play.feed(Beat(frozenset({ME, PEER}), (), listed_again=True))
    _watching(play, key_hash(ours), PEER)
    _watching(play, key_hash(theirs), PEER)
    play.step(Untracked(ours), GaveUp(key_hash(ours)))
    play.step(Untracked(theirs))  # another replica polls it: nothing to stop here
    assert play.engine.owned_count == 0
    play.step(InterestHeard(key_hash(ours), PEER, False))  # not followed any more


def test_a_replica_cut_from_the_upstream_hands_its_keys_to_an_interested_one_that_reads() -> None:
    theirs = key_won_by(PEER, ME, THIRD)
    hashed = key_hash(theirs)
    play = book()
    play.feed(Beat(frozenset({ME, PEER, THIRD}), (), listed_again=True))
    _watching(play, hashed, PEER)
    play.step(CutChanged(frozenset({PEER})), Moved(frozenset({hashed}), NOBODY))
    play.step(CutChanged(frozenset({PEER})))  # said again: nothing moves
    play.step(CutChanged(frozenset({PEER, ME})), Moved(NOBODY, frozenset({hashed})))  # all cut: as if none
    play.step(CutChanged(NOBODY))


# -- interest routing ------------------------------------------------------------------------------------------


def test_interest_heard_while_ours_is_being_written_wins_over_what_the_write_read_back() -> None:
    theirs = key_won_by(PEER, ME)
    hashed = key_hash(theirs)
    play = book()
    play.feed(Beat(frozenset({ME, PEER}), (), listed_again=True))
    play.step(OursQueued(hashed))
    assert play.engine.settling(hashed)
    play.step(InterestHeard(hashed, PEER, False))  # held back: newer than what the write reads back
    assert play.engine.settling(hashed)
    play.step(OursWritten(hashed, frozenset({PEER})), Moved(frozenset({hashed}), NOBODY))
    assert not play.engine.settling(hashed)
    assert not play.engine.joining(hashed)


def test_a_replica_joining_while_ours_is_written_is_counted_though_the_write_did_not_read_it() -> None:
    theirs = key_won_by(PEER, ME)
    hashed = key_hash(theirs)
    play = book()
    play.feed(Beat(frozenset({ME, PEER}), (), listed_again=True))
    play.feed(OursQueued(hashed))
    play.step(InterestHeard(hashed, PEER, True))
    play.step(OursWritten(hashed, NOBODY))  # it wins the key: nothing of ours to take over


def test_a_key_given_up_while_its_interest_was_written_drops_what_was_held_back_for_it() -> None:
    theirs = key_won_by(PEER, ME)
    hashed = key_hash(theirs)
    play = book()
    play.feed(Beat(frozenset({ME, PEER}), (), listed_again=True))
    play.feed(OursQueued(hashed))
    play.feed(InterestHeard(hashed, PEER, True))
    play.step(Untracked(theirs))
    assert not play.engine.settling(hashed)
    # Watched again: what was held back then is not applied over this write.
    play.feed(OursQueued(hashed))
    play.step(OursWritten(hashed, NOBODY), Moved(frozenset({hashed}), NOBODY))
