"""Who can read the upstream: a replica's own signal with hysteresis, and the declarations the fleet heard."""

from __future__ import annotations

import pytest

from sidecar.bus.readers import ReaderBoard, ReadSignal, confirmed_value, declared_value


@pytest.mark.invariant(23)
def test_one_failed_sample_does_not_stop_a_replica_reading() -> None:
    signal = ReadSignal(down_after_s=0.9, up_after_s=1.8)
    assert signal.sample(False, 0.0) is True
    assert signal.sample(True, 0.3) is True
    assert signal.sample(False, 0.6) is True
    assert signal.sample(False, 1.2) is True  # failing since 0.6: not yet 0.9 s
    assert signal.sample(False, 1.5) is False


def test_a_replica_that_reads_again_says_so_only_after_the_longer_wait() -> None:
    signal = ReadSignal(down_after_s=0.9, up_after_s=1.8)
    signal.sample(False, 0.0)
    assert signal.sample(False, 1.0) is False
    assert signal.sample(True, 2.0) is False
    assert signal.sample(False, 2.5) is False  # one failure restarts the wait
    assert signal.sample(True, 3.0) is False
    assert signal.sample(True, 4.7) is False
    assert signal.sample(True, 4.9) is True


@pytest.mark.invariant(23)
def test_a_declaration_moves_nothing_until_a_peer_that_reads_confirms_it() -> None:
    board = ReaderBoard("a")
    board.apply("a", declared_value("e1"))
    assert board.cut() == frozenset() and not board.moved({"a", "b"})
    assert board.unconfirmed() == {"a": "e1"}
    board.apply("a", confirmed_value("e1", "b"))
    assert board.cut() == {"a"} and board.moved({"a", "b"})
    assert board.unconfirmed() == {}


@pytest.mark.invariant(23)
def test_a_cut_replica_keeps_its_clients_when_no_live_peer_reads() -> None:
    board = ReaderBoard("a")
    board.apply("a", confirmed_value("e1", "b"))
    board.apply("b", declared_value("e2"))
    assert not board.moved({"a", "b"})  # b cannot read either now
    assert not board.moved({"a"})  # b is gone
    board.apply("b", None)
    assert board.moved({"a", "b"})


def test_a_withdrawn_or_unreadable_declaration_is_none() -> None:
    board = ReaderBoard("a")
    board.replace({"b": confirmed_value("e1", "a"), "c": "x:nonsense", "d": "c:e2"})
    assert board.cut() == {"b"} and board.unconfirmed() == {}
    board.apply("b", None)
    assert board.cut() == frozenset() and board.readers({"a", "b", "c", "d"}) == {"a", "b", "c", "d"}
