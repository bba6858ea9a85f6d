"""An error answer is an observation (invariant 24): the confirmation rule as playbooks of `ErrorConfirmation`, then
one watch driven through the engine by a hand-moved clock, and last through a registry reading a scripted upstream
as its polls do.

A JSON-RPC error the upstream answers for a watched resource is the resource's state: told once a second look
confirms it, told again when content comes back, quiet while it stays, polled at the key's interval with no
backoff. A transport failure or an HTTP 5xx stays a fault, and backs off.
"""

from __future__ import annotations

import itertools

import pytest

from sidecar.changes import WatchKey
from sidecar.protocol.errors import UpstreamError, UpstreamRpcError, UpstreamUnavailable
from sidecar.watch.engine import Engine
from sidecar.watch.engine.confirm import ErrorConfirmation, LookAgain, Seen, Take
from sidecar.watch.fingerprint import ABSENT, fingerprint_contents, fingerprint_error
from sidecar.watch.observation import Observation, read_failed
from sidecar.watch.rules import Rules
from tests.kit.playbook import Playbook
from tests.unit.watch.engine_cast import ALICE
from tests.unit.watch.engine_cast import SCHEDULE_CONFIG as CONFIG
from tests.unit.watch.engine_polls import Polled
from tests.unit.watch.registry_world import World
from tests.unit.watch.scripted_upstream import URL, contents

NOTE = "memory://notes/plan"
V1 = fingerprint_contents(contents(NOTE, "v1")["contents"])
V2 = fingerprint_contents(contents(NOTE, "v2")["contents"])
GONE = fingerprint_error(-32603, "note not found: plan")
BROKEN = fingerprint_error(-32603, "index is being rebuilt")

Book = Playbook[Seen, Take | LookAgain]

# -- the rule ------------------------------------------------------------------------------------------------------


@pytest.mark.invariant(24)
def test_a_new_error_state_is_taken_only_when_a_second_look_sees_an_error_too() -> None:
    rule = ErrorConfirmation()
    play = Book(rule)
    play.step(Seen(V1, GONE), LookAgain())
    assert rule.pending == GONE
    play.step(Seen(V1, GONE), Take())
    assert rule.pending is None
    play.step(Seen(GONE, GONE), Take())  # a stable error is the state it is in: nothing to confirm


@pytest.mark.invariant(24)
def test_a_lone_error_between_two_looks_that_see_content_is_never_taken() -> None:
    rule = ErrorConfirmation()
    play = Book(rule)
    play.step(Seen(V1, GONE), LookAgain())
    play.step(Seen(V1, V1), Take())  # the same content: no change, and the doubt is over
    assert rule.pending is None
    play.step(Seen(V1, GONE), LookAgain())  # a later error needs its own second look


def test_content_not_found_and_the_return_from_an_error_are_taken_at_once() -> None:
    play = Book(ErrorConfirmation())
    play.step(Seen(V1, V2), Take())
    play.step(Seen(V2, ABSENT), Take())
    play.step(Seen(GONE, V1), Take())


def test_two_different_errors_in_a_row_confirm_the_second_so_a_changing_message_costs_one_look_not_a_storm() -> None:
    rule = ErrorConfirmation()
    play = Book(rule)
    play.step(Seen(V1, GONE), LookAgain())
    play.step(Seen(V1, BROKEN), Take())
    play.step(Seen(BROKEN, GONE), LookAgain())  # a new error after a confirmed one is a change to confirm
    rule.clear()  # another replica's look was adopted meanwhile
    play.step(Seen(V1, GONE), LookAgain())


# -- one watch, driven through the engine ----------------------------------------------------------------------

TTL_MS = 2000
"""The note's ttlMs: its interval (2 s; jitter at zero with rand() = 0.5), kept while it is an error."""
TTL_S = TTL_MS / 1000
CONFIRM_S = 0.25 + 0.5 * CONFIG.jitter * 0.25
"""A hinted look's wait after the look before it: min_interval_ms, jittered as a poll that waits (rand() = 0.5)."""

DELETED = Observation(GONE, None, False)


class _Note:
    """Alice's watch of the note, polled through the engine on a hand-moved clock; each poll sees `seen`."""

    def __init__(self) -> None:
        self.seen: Observation | UpstreamError = Observation(V1, TTL_MS, False)
        engine = Engine(linger_s=8.0, absent_ttl_s=5.0, rate_per_s=1000.0, rules=Rules([]), polling=CONFIG,
                        rand=lambda: 0.5)  # fmt: skip
        self.polled = Polled(engine, lambda key, started: self.seen)
        self.key = self.polled.watch(ALICE, NOTE, Observation(V1, TTL_MS, False))

    def poll(self) -> None:
        """The next timer fires; its poll runs to its end (the next one armed)."""
        self.polled.clock.fire_next()

    def observed(self) -> list[str]:
        return [command.fingerprint for command in self.polled.observed]


@pytest.mark.invariant(24)
def test_a_deleted_note_is_told_after_a_second_look_then_polled_quietly_and_told_again_once_back() -> None:
    note = _Note()
    note.poll()  # 2 s: v1
    note.seen = DELETED
    note.poll()  # 4 s: the error, told to nobody yet
    assert note.polled.told() == []
    assert note.observed()[-1] == GONE, "the cache hears of the error at once: it drops the content it holds"
    note.poll()  # the confirming look, soon: a hinted look's schedule, not the next interval
    polls = note.polled.polls
    assert polls[2].at == pytest.approx(2 * TTL_S + CONFIRM_S) and polls[2].hinted
    assert note.polled.published[-1].generation == 1 and note.polled.told() == [GONE]
    for _ in range(3):
        note.poll()  # a stable error: quiet, at the note's interval, never backing off
    assert note.polled.told() == [GONE]
    started = note.polled.started_at()
    assert [b - a for a, b in itertools.pairwise(started[2:])] == pytest.approx([TTL_S] * 3)
    assert note.polled.record(note.key).consecutive_errors == 0
    note.seen = Observation(V2, TTL_MS, False)
    note.poll()
    assert note.polled.told() == [GONE, V2], "written again: told at the first look that sees it"
    assert note.observed() == [V1] + [GONE] * 5 + [V2], "every poll's look applied, the unconfirmed one too"


@pytest.mark.invariant(24)
def test_a_lone_error_between_two_looks_of_the_same_note_tells_nobody() -> None:
    note = _Note()
    note.seen = DELETED
    note.poll()  # 2 s: an error
    note.seen = Observation(V1, TTL_MS, False)
    note.poll()  # its confirming look sees the note as it was
    note.poll()
    assert note.polled.told() == []
    assert note.polled.started_at() == pytest.approx([2.0, 2.0 + CONFIRM_S, 2.0 + CONFIRM_S + TTL_S])
    note.seen = Observation(V2, TTL_MS, False)
    note.poll()
    assert note.polled.told() == [V2], "a real change after it is told"


def test_a_fault_is_not_a_state_it_backs_off_and_tells_nobody() -> None:
    note = _Note()
    note.seen = UpstreamUnavailable(URL, "connection refused")
    for _ in range(3):
        note.poll()
    assert note.polled.started_at() == pytest.approx([2.0, 3.0, 5.0]), "backoff: 1 s, then 2 s"
    assert note.polled.record(note.key).consecutive_errors == 3
    assert note.polled.told() == [] and note.observed() == [], "no look was applied: the cache keeps what it holds"


@pytest.mark.parametrize(
    "fault",
    [
        UpstreamRpcError(URL, {"code": -32603, "message": "bad gateway"}, http_status=502),
        UpstreamRpcError(URL, {"code": -32603, "message": "down"}, http_status=500),
        UpstreamRpcError(URL, {"code": -32000, "message": "slow down"}, http_status=429),
        UpstreamRpcError(URL, {"code": -32000, "message": "too slow"}, http_status=408),
    ],
    ids=["http-5xx", "http-500", "http-429", "http-408"],
)
def test_an_error_answered_with_an_http_5xx_429_or_408_is_a_fault_a_poll_raises_not_a_state(
    fault: UpstreamRpcError,
) -> None:
    # Raised, the poll fails: it backs off and tells nobody, as the playbook above shows (a transport failure is
    # raised as it is: no JSON-RPC error to read).
    assert read_failed(fault, errors_are_states=True) is None
    answered = UpstreamRpcError(URL, {"code": fault.code, "message": "bad gateway"})  # the same error, without it
    assert read_failed(answered, errors_are_states=True) == Observation(
        fingerprint_error(fault.code, "bad gateway"), None, False
    )


# -- through the registry: the upstream's answers, as a poll reads them ------------------------------------------

KEY = WatchKey("resource", NOTE, "alice")


async def _watched(world: World) -> list[str]:
    """Alice's watch of the note (ttlMs 2 s: polled every 2 s, no jitter here); what the cache is told of it."""
    world.upstream.resources[NOTE] = contents(NOTE, "v1", ttlMs=TTL_MS)
    observed: list[str] = []
    world.registry.on_observation(lambda key, fingerprint, ticket: observed.append(fingerprint))
    assert await world.registry.acquire("resource", NOTE, ALICE) is not None
    return observed


def _polls(world: World, outcome: str) -> float:
    return world.gauge("mcp_sidecar_polls_total", kind="resource", outcome=outcome) or 0.0


@pytest.mark.invariant(24)
async def test_an_error_the_upstream_answers_for_the_note_is_its_state_told_once_confirmed(world: World) -> None:
    observed = await _watched(world)
    world.upstream.errors["resources/read"] = {"code": -32603, "message": "note not found: plan"}
    await world.step(TTL_S, looks=1)
    assert world.changes() == [] and observed[-1] == GONE, "the cache drops the note at once; nobody is told yet"
    assert world.clock.due() == [pytest.approx(TTL_S + 0.25)], "the confirming look: a hinted one, soon"
    await world.step(0.25, looks=1)
    assert world.changes() == [(KEY, GONE)]
    await world.step(TTL_S, looks=1)  # a stable error: quiet, at the note's interval
    assert world.changes() == [(KEY, GONE)]
    world.upstream.errors.clear()
    world.upstream.resources[NOTE] = contents(NOTE, "v2", ttlMs=TTL_MS)
    await world.step(TTL_S, looks=1)
    assert world.changes() == [(KEY, GONE), (KEY, V2)]
    assert (_polls(world, "error_state"), _polls(world, "error"), _polls(world, "ok")) == (3, 0, 1)
    [summary] = world.registry.watches()
    assert summary.consecutive_errors == 0
