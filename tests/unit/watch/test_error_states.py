"""An error answer is an observation (invariant 24): the confirmation rule as playbooks of `ErrorConfirmation`, then
one watch driven through it on a hand-moved clock, reading a scripted upstream as its polls do.

A JSON-RPC error the upstream answers for a watched resource is the resource's state: told once a second look
confirms it, told again when content comes back, quiet while it stays, polled at the key's interval with no
backoff. A transport failure or an HTTP 5xx stays a fault, and backs off.
"""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from sidecar.changes import ChangeEvent, WatchKey
from sidecar.config import PollingConfig
from sidecar.identity import ANONYMOUS, Identity
from sidecar.observability.metrics import Metrics
from sidecar.protocol.errors import UpstreamRpcError, UpstreamUnavailable
from sidecar.upstream.base import Upstream
from sidecar.watch.engine.confirm import ErrorConfirmation, LookAgain, Seen, Take
from sidecar.watch.fingerprint import ABSENT, fingerprint_contents, fingerprint_error
from sidecar.watch.observation import Observation
from sidecar.watch.observe import observe
from sidecar.watch.poller import Watch
from sidecar.watch.schedule import Schedule
from sidecar.watch.tickets import Tickets
from tests.kit.playbook import Playbook
from tests.unit.watch.manual_clock import ManualClock
from tests.unit.watch.scripted_upstream import URL, ScriptedUpstream, contents

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


# -- one watch, driven -------------------------------------------------------------------------------------------

CONFIG = PollingConfig(
    default_interval_ms=5000,
    min_interval_ms=250,
    max_interval_ms=60000,
    jitter=0.1,
    backoff_initial_ms=1000,
    backoff_max_ms=8000,
)
TTL_MS = 2000
"""The note's ttlMs: its interval (2 s; jitter at zero with rand() = 0.5), kept while it is an error."""


class _Note:
    """A watch of the note, polled as the registry polls (`observe` with errors as states), on a manual clock."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.upstream = ScriptedUpstream()
        self.upstream.resources[NOTE] = contents(NOTE, "v1", ttlMs=TTL_MS)
        self.events: list[ChangeEvent] = []
        self.observed: list[str] = []
        self.polled_at: list[float] = []
        self.metrics = Metrics()
        tickets = Tickets()
        self.watch = Watch(
            WatchKey("resource", NOTE, "public"),
            Observation(V1, TTL_MS, False),
            tickets.take(),
            schedule=Schedule(CONFIG, rand=lambda: 0.5),
            reader=self._read,
            sink=self._sink,
            gate=asyncio.Semaphore(4),
            tickets=tickets,
            metrics=self.metrics,
            on_auth_failure=lambda *_: None,
            observed=lambda key, fingerprint, ticket: self.observed.append(fingerprint),
            clock=self.clock,
            holders=lambda key: 1,
        )
        self.watch.start()

    async def _read(self, watch: Watch) -> Observation:
        self.polled_at.append(self.clock.now())
        return await observe(
            cast(Upstream, self.upstream), "resource", NOTE, Identity(ANONYMOUS, ()), errors_are_states=True
        )

    async def _sink(self, event: ChangeEvent) -> None:
        self.events.append(event)

    def answers(self, text: str | None, *, code: int = -32603, message: str = "note not found: plan") -> None:
        """From the next read on: the note's text, or (None) the error the upstream answers for it."""
        if text is None:
            self.upstream.errors["resources/read"] = {"code": code, "message": message}
        else:
            self.upstream.errors.pop("resources/read", None)
            self.upstream.resources[NOTE] = contents(NOTE, text, ttlMs=TTL_MS)

    async def poll(self) -> None:
        """The next timer fires; its poll runs to its end (the next one armed)."""
        self.clock.fire_next()
        await self.clock.until(lambda: self.clock.pending() == 1, "the poll ended, the next one armed")

    def told(self) -> list[str]:
        return [event.fingerprint for event in self.events]

    def polls(self, outcome: str) -> float:
        sample = {"kind": "resource", "outcome": outcome}
        return self.metrics.registry.get_sample_value("mcp_sidecar_polls_total", sample) or 0.0


@pytest.mark.invariant(24)
async def test_a_deleted_note_is_told_after_a_second_look_then_polled_quietly_and_told_again_once_back() -> None:
    note = _Note()
    await note.poll()  # 2 s: v1
    note.answers(None)
    await note.poll()  # 4 s: the error, told to nobody yet
    assert note.told() == []
    assert note.observed[-1] == GONE, "the cache hears of the error at once: it drops the content it holds"
    await note.poll()  # the confirming look, soon: a hinted look's schedule, not the next interval
    assert note.polled_at[2] == pytest.approx(4.25, abs=0.05)
    assert note.told() == [GONE]
    for _ in range(3):
        await note.poll()  # a stable error: quiet, at the note's interval, never backing off
    assert note.told() == [GONE]
    assert [b - a for a, b in zip(note.polled_at[2:], note.polled_at[3:], strict=False)] == pytest.approx([2.0] * 3)
    assert note.watch.consecutive_errors == 0
    note.answers("v2")
    await note.poll()
    assert note.told() == [GONE, V2], "written again: told at the first look that sees it"
    assert note.polls("error_state") == 5 and note.polls("error") == 0


@pytest.mark.invariant(24)
async def test_a_lone_error_between_two_looks_of_the_same_note_tells_nobody() -> None:
    note = _Note()
    note.answers(None)
    await note.poll()  # 2 s: an error
    note.answers("v1")
    await note.poll()  # its confirming look sees the note as it was
    await note.poll()
    assert note.told() == []
    assert note.polled_at == pytest.approx([2.0, 2.25, 4.25], abs=0.05)
    note.answers("v2")
    await note.poll()
    assert note.told() == [V2], "a real change after it is told"


@pytest.mark.parametrize(
    "fault",
    [
        UpstreamUnavailable(URL, "connection refused"),
        UpstreamRpcError(URL, {"code": -32603, "message": "bad gateway"}, http_status=502),
        UpstreamRpcError(URL, {"code": -32000, "message": "slow down"}, http_status=429),
    ],
    ids=["transport", "http-5xx", "http-429"],
)
async def test_a_fault_is_not_a_state_it_backs_off_and_tells_nobody(fault: Exception) -> None:
    note = _Note()
    note.upstream.failure = cast(UpstreamUnavailable, fault)
    for _ in range(3):
        await note.poll()
    assert note.polled_at == pytest.approx([2.0, 3.0, 5.0]), "backoff: 1 s, then 2 s"
    assert note.watch.consecutive_errors == 3
    assert note.told() == [] and note.observed == [], "no look was applied: the cache keeps what it holds"
    assert note.polls("error") == 3 and note.polls("error_state") == 0
