"""What the watches hear besides their own looks: forwarded requests and their answers, the upstream's refusals of
them, writes through the sidecar (here and on the other replicas), and the source's hints. Each becomes an event
for the engine (a forwarded answer or refusal, see `sidecar.watch.engine.evidence`; a write, debounced by
`sidecar.watch.engine.writes`) or a hint for the watches it concerns (a source's, see `HintRouting`); a call of a
tool the upstream lists as read-only teaches nothing (see `sidecar.watch.tool_calls`).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from sidecar.changes import PollCoordinator
from sidecar.config import ToolRule
from sidecar.identity import Identity
from sidecar.observability.metrics import Metrics
from sidecar.observability.tracing import tracing
from sidecar.protocol import JsonObject
from sidecar.watch.engine import Event, Forwarded, Refused, WatchIndex, WritesHeard, teaches
from sidecar.watch.hint_routing import HintRouting
from sidecar.watch.native import HintWatch
from sidecar.watch.source_hints import SourceHint
from sidecar.watch.tool_calls import ToolCalls, ToolCatalog

__all__ = ["Hearing"]


class Hearing:
    """The handler's observer of forwarded requests, the hint endpoint's target, and where the engine's writes go."""

    def __init__(
        self,
        feed: Callable[[Event], None],
        ticket: Callable[[], int],
        *,
        tool_rules: Sequence[ToolRule],
        tools: ToolCatalog,
        index: WatchIndex,
        hint: HintWatch,
        coordinator: PollCoordinator,
        metrics: Metrics,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self._feed = feed
        self.ticket = ticket
        """A ticket for a look at the upstream that starts now, taken before forwarding (`sidecar.watch.tickets`)."""
        self._tool_calls = ToolCalls(tool_rules, tools, metrics)
        """Which tool calls may write (`revalidate.tools`, and the tools lists the looks and forwarded answers show)."""
        self._routing = HintRouting(
            index, hint, coordinator, metrics, spawn=spawn, writes_heard=lambda contexts: feed(WritesHeard(contexts))
        )

    def after_forward(
        self, method: str, params: JsonObject, identity: Identity, answer: JsonObject, ticket: int
    ) -> None:
        """A forwarded request taught us something (see `sidecar.watch.engine.evidence`); a tools list shows which
        tools only read, and a call of one of those writes nothing (see `sidecar.watch.tool_calls`)."""
        if self._tool_calls.forwarded(method, params, identity.context, answer) and teaches(method):
            # A write's span (tracing on): the polls it causes link to it.
            self._feed(Forwarded(method, params, identity, answer, ticket, tracing().current_link()))

    def refused(self, method: str, params: JsonObject, identity: Identity) -> None:
        """The upstream refused `identity` a forwarded request (401/403) (see `sidecar.watch.engine.evidence`)."""
        self._feed(Refused(method, params, identity))

    def source(self, hint: SourceHint) -> int:
        """The source says what changed: the watches it names look soon (see `HintRouting`); how many here."""
        return self._routing.source(hint)
