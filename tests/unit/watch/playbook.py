"""Playbooks for the watch engine: feed events at the times the test says, expect the exact commands back.

As in mitmproxy's proxy tests, nothing runs in between and nothing is waited for: the engine is a plain object,
so a step is a function call and a mismatch is shown as a diff of the commands, one per line.
"""

from __future__ import annotations

import difflib
import pprint
from collections.abc import Sequence

from sidecar.watch.engine import Engine
from sidecar.watch.engine.commands import Command
from sidecar.watch.engine.events import Event

__all__ = ["Playbook"]


class Playbook:
    """One engine, its time, and each step's events and commands (kept for the failure message)."""

    def __init__(self, engine: Engine, now: float = 0.0) -> None:
        self.engine = engine
        self.now = now
        self.steps: list[tuple[float, Event, list[Command]]] = []

    def at(self, now: float) -> Playbook:
        """What follows happens at `now` (time never goes back)."""
        assert now >= self.now, f"time goes forward: {now} < {self.now}"
        self.now = now
        return self

    def feed(self, event: Event) -> list[Command]:
        """`event` happens now: the commands it asks for."""
        commands = self.engine.handle(event, self.now)
        self.steps.append((self.now, event, commands))
        return commands

    def step(self, event: Event, *expected: Command) -> None:
        """`event` happens now and asks for exactly `expected`, in that order."""
        commands = self.feed(event)
        if commands != list(expected):
            raise AssertionError(self._mismatch(event, list(expected), commands))

    def _mismatch(self, event: Event, expected: Sequence[Command], got: Sequence[Command]) -> str:
        diff = difflib.unified_diff(_lines(expected), _lines(got), "expected", "got", lineterm="")
        story = "\n".join(f"  t={now:g} {event!r} -> {len(commands)} commands" for now, event, commands in self.steps)
        return f"at t={self.now:g}, {event!r} asked for other commands:\n" + "\n".join(diff) + f"\nsteps:\n{story}"


def _lines(commands: Sequence[Command]) -> list[str]:
    return [pprint.pformat(command, width=120) for command in commands]
