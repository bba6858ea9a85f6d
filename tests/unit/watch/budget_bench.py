"""The read budget's bench: the engine the registry drives, built from a `PollingConfig` as the registry builds it,
on the hand-moved clock with no event loop, over resources the test changes, every read noted by when it was made.

Each poll reads at once what the resources hold then, as the registry's polls do when the polls due at one time
end before time moves on (`run_polls`); writes reach the watches as the engine's write debounce hints them. Figures
here are engine time, not machine speed.
"""

from __future__ import annotations

import itertools
from typing import Any

from sidecar.changes import WatchKey
from sidecar.config import PollingConfig
from sidecar.identity import ANONYMOUS_IDENTITY
from sidecar.watch.engine import Engine
from sidecar.watch.engine.commands import BudgetShare, Publish
from sidecar.watch.engine.events import Release, Wrote
from sidecar.watch.observation import Observation, observation_from_read
from sidecar.watch.rules import Rules
from tests.unit.watch.engine_polls import Polled
from tests.unit.watch.scripted_upstream import contents

__all__ = ["Bench"]


class Bench:
    """The engine over resources by URI, every read noted (`read_at`), what it told noted with its time."""

    def __init__(self, config: PollingConfig) -> None:
        self.rules = Rules(config.rules)
        engine = Engine(
            linger_s=config.linger_ms / 1000,
            absent_ttl_s=config.default_interval_ms / 1000,
            rate_per_s=config.max_baselines_per_s,
            rules=self.rules,
            polling=config,
        )
        self.engine = engine
        self.polled = Polled(engine, self._poll)
        self.clock = self.polled.clock
        self.resources: dict[str, dict[str, Any]] = {}
        """Each URI's `resources/read` result now."""
        self.read_at: dict[str, list[float]] = {}
        self._reads: list[str] = []

    def _read(self, uri: str) -> Observation:
        self.read_at.setdefault(uri, []).append(self.clock.now())
        self._reads.append(uri)
        return observation_from_read(self.resources[uri], self.rules.for_uri(uri))

    def _poll(self, key: WatchKey, started: float) -> Observation:
        assert key.uri is not None
        return self._read(key.uri)

    def set(self, uri: str, text: str) -> None:
        self.resources[uri] = contents(uri, text)

    def watch(self, uris: list[str]) -> list[WatchKey]:
        """Anonymous subscribes to each URI (its content "0" unless set) now: the watches it holds."""
        keys = []
        for uri in uris:
            self.resources.setdefault(uri, contents(uri, "0"))
            keys.append(self.polled.watch(ANONYMOUS_IDENTITY, uri, self._read(uri)))
        return keys

    def release(self, key: WatchKey) -> None:
        """The stream holding `key`'s watch lets go of it (it lingers, then ends)."""
        self.polled.feed(Release(key, key.context))

    def wrote(self) -> None:
        """Anonymous made a request that may have written: its watches are hinted, as the engine hints them."""
        self.polled.feed(Wrote(ANONYMOUS_IDENTITY.context))

    def run(self, seconds: float) -> None:
        """Move the clock on by `seconds`, each poll starting at its own time and ending before time moves on."""
        self.clock.advance(seconds)

    def reads(self) -> list[str]:
        """The URIs read (first reads and polls), in order."""
        return list(self._reads)

    def watched(self) -> set[str | None]:
        return {key.uri for key in self.engine.keys()}

    def only_polls_armed(self) -> bool:
        """No poll in flight, and on the clock only each watch's next poll: one timer a watch, none of a watch
        that has stopped (its next poll, its linger) left armed."""
        return not self.polled.held and self.clock.pending() == len(self.engine.keys())

    def told(self) -> list[tuple[float, Publish]]:
        """Each change told (not a first look), with when."""
        return [(now, c) for now, _, commands in self.polled.play.steps for c in commands if isinstance(c, Publish)]

    def budget_shares(self) -> set[float]:
        """The replica's shares of the read budget the engine reported (the registry's gauge)."""
        return {c.per_s for _, _, commands in self.polled.play.steps for c in commands if isinstance(c, BudgetShare)}

    def waits(self, limit: str) -> list[float]:
        """How long each poll that waited for `limit` waited (the registry's queue-wait histogram)."""
        return [wait.seconds for wait in self.polled.waited if wait.limit == limit]

    def poll_gaps(self, since: float) -> list[float]:
        """The time between each two reads after `since` (of any keys), in order."""
        times = sorted(at for reads in self.read_at.values() for at in reads if at > since)
        return [later - earlier for earlier, later in itertools.pairwise(times)]

    def longest_unread(self, since: float, until: float) -> float:
        """The longest any URI went without a read between `since` and `until`."""
        gaps = []
        for times in self.read_at.values():
            edges = [since, *(t for t in times if since < t < until), until]
            gaps.append(max(b - a for a, b in itertools.pairwise(edges)))
        return max(gaps)
