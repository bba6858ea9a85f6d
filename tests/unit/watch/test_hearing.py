"""What the watches hear besides their own looks (`sidecar.watch.hearing`): each forwarded request that can teach them
something, and each refusal, reaches the engine as an event, a write with the span it was traced in; a call of a tool
the upstream lists as read-only reaches it not at all. No event loop: the engine's side is a list of the events fed.
"""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sidecar.changes import LocalCoordinator
from sidecar.observability.metrics import Metrics
from sidecar.observability.tracing import tracing
from sidecar.watch.engine import Event, Forwarded, Refused, WatchIndex
from sidecar.watch.hearing import Hearing
from sidecar.watch.tool_calls import ToolCatalog
from tests.unit.watch.engine_cast import ALICE, BOB, DOC
from tests.unit.watch.engine_polls import run_spawned
from tests.unit.watch.test_tool_calls import LOOKUP, PLAIN


class _Heard:
    """A `Hearing` whose engine records what it is fed."""

    def __init__(self) -> None:
        self.fed: list[Event] = []
        self.hearing = Hearing(
            self.fed.append,
            lambda: 7,
            tool_rules=(),
            tools=ToolCatalog(),
            index=WatchIndex(),
            hint=lambda key, *, warm=False: None,
            coordinator=LocalCoordinator(),
            metrics=Metrics(),
            spawn=run_spawned,
        )


def test_a_forwarded_write_and_a_forwarded_read_reach_the_engine_and_other_requests_do_not() -> None:
    heard = _Heard()
    hearing = heard.hearing
    read = {"result": {"contents": [{"uri": DOC, "text": "v1"}]}}
    hearing.after_forward("resources/read", {"uri": DOC}, ALICE, read, 3)
    hearing.after_forward("tools/call", {"name": "edit"}, BOB, {"result": {}}, 4)
    hearing.after_forward("resources/list", {}, BOB, {"result": {"resources": []}}, 5)  # teaches nothing
    assert heard.fed == [
        Forwarded("resources/read", {"uri": DOC}, ALICE, read, 3),
        Forwarded("tools/call", {"name": "edit"}, BOB, {"result": {}}, 4),
    ]
    assert hearing.ticket() == 7, "the ticket a forwarded request takes is the looks' own"


def test_a_forwarded_tools_list_keeps_its_read_only_tools_calls_from_the_engine() -> None:
    heard = _Heard()
    heard.hearing.after_forward("tools/list", {}, ALICE, {"result": {"tools": [LOOKUP, PLAIN]}}, 1)
    heard.hearing.after_forward("tools/call", {"name": "lookup"}, ALICE, {"result": {}}, 2)
    assert heard.fed == [], "the list shows `lookup` only reads: its call teaches nothing"
    heard.hearing.after_forward("tools/call", {"name": "plain"}, ALICE, {"result": {}}, 3)
    heard.hearing.after_forward("tools/call", {"name": "lookup"}, BOB, {"result": {}}, 4)  # bob was shown no list
    assert [(event.params["name"], event.identity) for event in heard.fed if isinstance(event, Forwarded)] == [
        ("plain", ALICE),
        ("lookup", BOB),
    ]


def test_a_refused_forwarded_request_reaches_the_engine_as_a_refusal() -> None:
    heard = _Heard()
    heard.hearing.refused("resources/read", {"uri": DOC}, BOB)
    assert heard.fed == [Refused("resources/read", {"uri": DOC}, BOB)]


def test_a_forwarded_write_carries_the_span_it_was_traced_in(spans: InMemorySpanExporter) -> None:
    heard = _Heard()
    with tracing().request("tools/call", {}, None) as span:
        heard.hearing.after_forward("tools/call", {"name": "edit"}, ALICE, {"result": {}}, 1)
        written = span.get_span_context()
    heard.hearing.after_forward("tools/call", {"name": "edit"}, ALICE, {"result": {}}, 2)  # outside any span
    links = [event.link for event in heard.fed if isinstance(event, Forwarded)]
    assert links[0] is not None and links[0].context == written
    assert links[1] is None
