"""Rendezvous ownership: even, stable, and moving only what a joining or leaving replica must."""

from __future__ import annotations

from collections import Counter

import pytest

from sidecar.bus.ownership import Ownership, rendezvous_owner, weight

KEYS = [f"key-{n}" for n in range(3000)]
REPLICAS = [f"replica-{n}" for n in range(5)]


def _owners(replicas: list[str]) -> dict[str, str | None]:
    return {key: rendezvous_owner(replicas, key) for key in KEYS}


def test_keys_spread_evenly_over_the_replicas() -> None:
    shares = Counter(_owners(REPLICAS).values())
    mean = len(KEYS) / len(REPLICAS)
    assert max(shares.values()) <= 1.15 * mean, shares


def test_a_replica_leaving_moves_only_the_keys_it_owned() -> None:
    before = _owners(REPLICAS)
    after = _owners(REPLICAS[:-1])
    moved = {key for key in KEYS if before[key] != after[key]}
    assert moved == {key for key in KEYS if before[key] == REPLICAS[-1]}


def test_a_replica_joining_takes_about_its_share_and_nothing_moves_between_the_others() -> None:
    before = _owners(REPLICAS[:-1])
    after = _owners(REPLICAS)
    moved = [key for key in KEYS if before[key] != after[key]]
    assert all(after[key] == REPLICAS[-1] for key in moved)
    assert len(moved) <= 1.3 * len(KEYS) / len(REPLICAS)


def test_every_replica_with_the_same_view_agrees_on_one_owner_per_key() -> None:
    tables = {name: Ownership(name) for name in REPLICAS}
    for table in tables.values():
        table.set_live(REPLICAS)
        for key in KEYS[:300]:
            table.track(key, REPLICAS)
    for key in KEYS[:300]:
        assert sum(table.owns(key) for table in tables.values()) == 1, key


def test_only_interested_replicas_own_and_the_owner_changes_when_interest_leaves() -> None:
    a, b = Ownership("a"), Ownership("b")
    for table in (a, b):
        table.set_live(["a", "b", "c"])  # c is live but has no interest in the key
    a.track("k", ["a", "b"])
    b.track("k", ["a", "b"])
    assert a.owns("k") != b.owns("k")
    owner, other = (a, b) if a.owns("k") else (b, a)
    gained, _ = other.interest("k", owner.me, present=False)
    assert gained == {"k"} and other.owns("k")


def test_a_dead_replica_loses_its_keys_to_the_interested_survivors() -> None:
    table = Ownership("a")
    table.set_live(["a", "b"])
    owned_by_b = [key for key in KEYS[:200] if rendezvous_owner(["a", "b"], key) == "b"]
    for key in KEYS[:200]:
        table.track(key, ["a", "b"])
    assert not any(table.owns(key) for key in owned_by_b)
    gained, lost = table.set_live(["a"])
    assert gained == set(owned_by_b) and not lost
    # Only late, b comes back with its interest and its keys: nothing was forgotten.
    gained, lost = table.set_live(["a", "b"])
    assert lost == set(owned_by_b) and not gained
    table.forget("b")  # dead for good: its interest was cleaned up
    assert table.interested(owned_by_b[0]) == {"a"}
    assert table.interested("a key not tracked") == frozenset()


def test_the_draw_is_the_same_on_every_replica_of_every_version() -> None:
    # Replicas of two versions side by side (a rolling upgrade) must pick the same owner: the draw is part of the
    # wire, like the Redis layout.
    assert weight("replica-a", "0123abcd") == 8299955453811716860
    assert rendezvous_owner([], "0123abcd") is None


def test_this_replica_counts_as_live_for_itself_before_its_heartbeat_is_read() -> None:
    table = Ownership("a")
    gained, _ = table.track("k", [])
    assert gained == {"k"}
    table.set_live(["b"])  # a heartbeat read that does not list us yet
    assert table.owns("k")


@pytest.mark.invariant(23)
def test_a_replica_cut_from_the_upstream_gives_its_keys_to_the_interested_replicas_that_read() -> None:
    tables = {name: Ownership(name) for name in REPLICAS}
    for table in tables.values():
        table.set_live(REPLICAS)
        for key in KEYS[:300]:
            table.track(key, REPLICAS)
    cut = REPLICAS[0]
    held = {key for key in KEYS[:300] if tables[cut].owns(key)}
    moves = {name: table.set_cut([cut]) for name, table in tables.items()}
    assert moves[cut] == (set(), held)
    gained = set().union(*(moves[name][0] for name in REPLICAS[1:]))
    assert gained == held  # only the cut replica's keys move, each to one reader
    for key in KEYS[:300]:
        assert sum(table.owns(key) for table in tables.values()) == 1, key
    assert not any(tables[cut].owns(key) for key in KEYS[:300])
    # Readable again: exactly its keys come back.
    back = {name: table.set_cut([]) for name, table in tables.items()}
    assert back[cut] == (held, set())


def test_a_cut_replica_keeps_the_keys_no_reader_is_interested_in() -> None:
    a, b = Ownership("a"), Ownership("b")
    for table in (a, b):
        table.set_live(["a", "b"])
    a.track("only-a", [])
    assert a.owns("only-a")
    assert a.set_cut(["a"]) == (set(), set()) and a.owns("only-a")


@pytest.mark.invariant(23)
def test_with_every_interested_replica_cut_ownership_is_as_if_none_were() -> None:
    tables = {name: Ownership(name) for name in REPLICAS[:3]}
    for table in tables.values():
        table.set_live(REPLICAS[:3])
        for key in KEYS[:100]:
            table.track(key, REPLICAS[:3])
    before = {key: [name for name, table in tables.items() if table.owns(key)] for key in KEYS[:100]}
    for table in tables.values():
        assert table.set_cut(REPLICAS[:3]) == (set(), set())
    after = {key: [name for name, table in tables.items() if table.owns(key)] for key in KEYS[:100]}
    assert after == before
