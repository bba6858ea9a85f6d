"""Playbooks for a sans-I/O machine: feed events at the times the test says, expect the exact commands back.

As in mitmproxy's proxy tests, nothing runs in between and nothing is waited for: the machine (the registry's
`Engine`, one watch's `PollPlan`, the Redis bus's `BusMachine`) is a plain object, so a step is a function call and
a mismatch is shown as a diff of the commands, one per line.
"""

from __future__ import annotations

import difflib
import pprint
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

__all__ = ["Machine", "Playbook"]

E = TypeVar("E")
C = TypeVar("C")
E_contra = TypeVar("E_contra", contravariant=True)
C_co = TypeVar("C_co", covariant=True)


class Machine(Protocol[E_contra, C_co]):
    """A sans-I/O state machine: an event and the time it happened in, the commands it asks for out."""

    def handle(self, event: E_contra, now: float) -> list[C_co]: ...


class Playbook(Generic[E, C]):
    """One machine, its time, and each step's events and commands (kept for the failure message)."""

    def __init__(self, engine: Machine[E, C], now: float = 0.0) -> None:
        self.engine = engine
        self.now = now
        self.steps: list[tuple[float, E, list[C]]] = []

    def at(self, now: float) -> Playbook[E, C]:
        """What follows happens at `now` (time never goes back)."""
        assert now >= self.now, f"time goes forward: {now} < {self.now}"
        self.now = now
        return self

    def feed(self, event: E) -> list[C]:
        """`event` happens now: the commands it asks for."""
        commands = self.engine.handle(event, self.now)
        self.steps.append((self.now, event, commands))
        return commands

    def step(self, event: E, *expected: C) -> None:
        """`event` happens now and asks for exactly `expected`, in that order."""
        commands = self.feed(event)
        if commands != list(expected):
            raise AssertionError(self._mismatch(event, list(expected), commands))

    def _mismatch(self, event: E, expected: Sequence[C], got: Sequence[C]) -> str:
        diff = difflib.unified_diff(_lines(expected), _lines(got), "expected", "got", lineterm="")
        story = "\n".join(f"  t={now:g} {event!r} -> {len(commands)} commands" for now, event, commands in self.steps)
        return f"at t={self.now:g}, {event!r} asked for other commands:\n" + "\n".join(diff) + f"\nsteps:\n{story}"


def _lines(commands: Sequence[object]) -> list[str]:
    return [pprint.pformat(command, width=120) for command in commands]
