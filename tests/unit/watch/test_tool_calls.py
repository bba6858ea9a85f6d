"""Which tool calls make the watches look: the decision over the tools lists and `revalidate.tools`, then the
registry acting on it (a real `WatchRegistry` on the hand-moved clock, reading a scripted upstream): the tools
lists its polls read and its rules reach the decision, and a call decided read-only hints no watch."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.config import ToolRule
from sidecar.identity import PUBLIC
from sidecar.observability.metrics import Metrics
from sidecar.watch.tool_calls import ToolCalls, ToolCatalog
from tests.unit.watch.registry_world import ALICE, DOC, failures, make_world
from tests.unit.watch.scripted_upstream import contents

Tool = dict[str, Any]


def tool(name: str, **annotations: Any) -> Tool:
    return {"name": name, "inputSchema": {"type": "object"}, **({"annotations": annotations} if annotations else {})}


LOOKUP = tool("lookup", readOnlyHint=True)
EDIT = tool("edit", readOnlyHint=False)
PLAIN = tool("plain")
"""A tool of a server that sets no annotations."""


def decisions(rules: list[ToolRule] | None = None) -> tuple[ToolCalls, ToolCatalog, Metrics]:
    metrics = Metrics()
    catalog = ToolCatalog()
    return ToolCalls(rules or [], catalog, metrics), catalog, metrics


def test_only_a_tool_its_list_marks_read_only_writes_nothing() -> None:
    calls, catalog, _ = decisions()
    catalog.learn("alice", [LOOKUP, EDIT, PLAIN, tool("hinted", readOnlyHint="yes")], complete=True)
    assert calls.decide("lookup", "alice") == ("read_only", "annotation")
    assert calls.decide("edit", "alice") == ("revalidate", "annotation")
    assert calls.decide("plain", "alice") == ("revalidate", "annotation"), "no annotation: it may write"
    assert calls.decide("hinted", "alice") == ("revalidate", "annotation"), "only the boolean true says read-only"
    assert calls.decide("never-listed", "alice") == ("revalidate", "unknown")
    assert calls.decide(None, "alice") == ("revalidate", "unknown")


def test_a_rule_overrides_the_annotation_either_way_the_first_that_fits_winning() -> None:
    rules = [
        ToolRule(match="lookup", revalidate=True),
        ToolRule(match="get_*", revalidate=False),
        ToolRule(match="*", revalidate=True),
    ]
    calls, catalog, _ = decisions(rules)
    catalog.learn("alice", [LOOKUP, tool("get_user")], complete=True)
    assert calls.decide("lookup", "alice") == ("revalidate", "rule"), "set read-only wrongly: the rule says it writes"
    assert calls.decide("get_user", "alice") == ("read_only", "rule"), "set no annotation: the rule says it reads"
    assert calls.decide("get_unseen", "alice") == ("read_only", "rule"), "a rule needs no tools list"
    assert calls.decide("anything", "alice") == ("revalidate", "rule")


def test_one_contexts_list_decides_only_its_own_calls_and_a_public_list_everyones() -> None:
    calls, catalog, _ = decisions()
    catalog.learn("alice", [LOOKUP], complete=True)
    assert calls.decide("lookup", "bob") == ("revalidate", "unknown"), "alice's list is not bob's"
    catalog.learn(PUBLIC, [tool("lookup"), tool("search", readOnlyHint=True)], complete=True)
    assert calls.decide("search", "bob") == ("read_only", "annotation")
    assert calls.decide("lookup", "alice") == ("read_only", "annotation"), "a context's own list first"


def test_a_whole_list_replaces_what_was_known_and_a_page_adds_to_it() -> None:
    calls, catalog, _ = decisions()
    catalog.learn("alice", [LOOKUP, EDIT], complete=True)
    catalog.learn("alice", [tool("search", readOnlyHint=True)], complete=False)
    assert calls.decide("lookup", "alice") == ("read_only", "annotation")
    assert calls.decide("search", "alice") == ("read_only", "annotation")
    catalog.learn("alice", [tool("lookup")], complete=True)  # the tool changed its annotation; search is gone
    assert calls.decide("lookup", "alice") == ("revalidate", "annotation")
    assert calls.decide("search", "alice") == ("revalidate", "unknown")


def test_a_forwarded_tools_list_answer_is_learnt_in_the_scope_it_carries() -> None:
    calls, catalog, _ = decisions()
    catalog.listed("alice", {}, {"result": {"tools": [LOOKUP]}})
    catalog.listed("alice", {}, {"error": {"code": -32603, "message": "down"}})  # teaches nothing
    catalog.listed("alice", {}, {"result": {"tools": "not a list"}})
    assert calls.decide("lookup", "alice") == ("read_only", "annotation")
    assert calls.decide("lookup", "bob") == ("revalidate", "unknown")
    catalog.listed("alice", {}, {"result": {"tools": [tool("search", readOnlyHint=True)], "nextCursor": "2"}})
    assert calls.decide("lookup", "alice") == ("read_only", "annotation"), "a first page of many adds to the list"
    catalog.listed("carol", {}, {"result": {"tools": [tool("search", readOnlyHint=True)], "cacheScope": "public"}})
    assert calls.decide("search", "bob") == ("read_only", "annotation")


def test_what_is_remembered_is_bounded_and_what_is_forgotten_writes() -> None:
    metrics = Metrics()
    catalog = ToolCatalog(max_contexts=2, max_tools=2)
    calls = ToolCalls([], catalog, metrics)
    catalog.learn("alice", [LOOKUP, tool("a", readOnlyHint=True), tool("b", readOnlyHint=True)], complete=True)
    assert calls.decide("a", "alice") == ("read_only", "annotation")
    assert calls.decide("b", "alice") == ("revalidate", "unknown"), "past the bound, a tool is unknown"
    catalog.learn("bob", [LOOKUP], complete=True)
    catalog.learn("carol", [LOOKUP], complete=True)
    assert calls.decide("lookup", "alice") == ("revalidate", "unknown"), "the least recently used context went"


def test_each_call_is_counted_by_decision_and_reason() -> None:
    calls, catalog, metrics = decisions([ToolRule(match="edit", revalidate=False)])
    catalog.learn("alice", [LOOKUP, PLAIN], complete=True)
    assert not calls.writes({"name": "lookup"}, "alice")
    assert not calls.writes({"name": "edit"}, "alice")
    assert calls.writes({"name": "plain"}, "alice")
    assert calls.writes({"name": "other"}, "alice")

    def counted(decision: str, reason: str) -> float | None:
        return metrics.registry.get_sample_value(
            "mcp_sidecar_tool_calls_total", {"decision": decision, "reason": reason}
        )

    assert counted("read_only", "annotation") == 1
    assert counted("read_only", "rule") == 1
    assert counted("revalidate", "annotation") == 1
    assert counted("revalidate", "unknown") == 1
    assert counted("revalidate", "rule") == 0, "each known series is there from the start"


def test_a_forwarded_tools_list_decides_its_contexts_calls_only() -> None:
    calls, _, _ = decisions()
    assert calls.forwarded("tools/list", {}, "alice", {"result": {"tools": [LOOKUP]}}), "a list is no write to hold"
    assert not calls.forwarded("tools/call", {"name": "lookup"}, "alice", {"result": {}}), "alice was shown it"
    assert calls.forwarded("tools/call", {"name": "lookup"}, "bob", {"result": {}}), "bob never was: it may write"
    assert calls.forwarded("resources/read", {"uri": DOC}, "alice", {"result": {}}), "not a call: as ever"


def test_a_rule_makes_a_tool_without_the_annotation_read_only() -> None:
    calls, catalog, _ = decisions([ToolRule(match="pl*", revalidate=False)])
    catalog.learn("alice", [PLAIN], complete=True)
    assert not calls.forwarded("tools/call", {"name": "plain"}, "alice", {"result": {}})
    assert calls.decide("plain", "alice") == ("read_only", "rule")
    assert calls.forwarded("tools/call", {"name": "other"}, "alice", {"result": {}})
    assert calls.decide("other", "alice") == ("revalidate", "unknown")


# -- the registry: the tools lists its polls read, and `revalidate.tools`, decide which forwarded calls hint ------


async def test_a_read_only_tools_call_makes_no_watch_look_and_a_writing_one_does(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = make_world(tool_rules=[ToolRule(match="get_*", revalidate=False)])
    # The tools list the registry polls (a client listens for its changes) says which tools only read.
    world.upstream.pages["tools/list"] = [{"tools": [LOOKUP, PLAIN]}]
    world.upstream.resources[DOC] = contents(DOC, "v1", cacheScope="public")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    assert await world.registry.acquire("tools_list", None, ALICE) is not None
    world.upstream.calls.clear()
    assert world.clock.advance(1.0) == 0
    world.registry.hearing.after_forward(
        "tools/call", {"name": "lookup"}, ALICE, {"result": {}}, world.registry.hearing.ticket()
    )
    assert world.clock.advance(0) == 0 and world.upstream.calls == [], "a read-only tool: no watch looks"
    world.registry.hearing.after_forward(
        "tools/call", {"name": "get_user"}, ALICE, {"result": {}}, world.registry.hearing.ticket()
    )
    assert world.clock.advance(0) == 0 and world.upstream.calls == [], "read-only by its revalidate.tools rule"
    # The tools list now marks `plain` read-only: the poll the next call asks for learns it, as a first read did.
    world.upstream.pages["tools/list"] = [{"tools": [LOOKUP, tool("plain", readOnlyHint=True)]}]
    world.registry.hearing.after_forward(
        "tools/call", {"name": "plain"}, ALICE, {"result": {}}, world.registry.hearing.ticket()
    )
    await world.step(0, looks=2)  # the control: a tool without the annotation makes both watches look
    assert sorted(world.upstream.calls) == [("resources/read", DOC, "alice"), ("tools/list", None, "alice")]
    world.clock.advance(1.0)  # the write's debounce window ends (nothing was written within it)
    world.upstream.calls.clear()
    world.registry.hearing.after_forward(
        "tools/call", {"name": "plain"}, ALICE, {"result": {}}, world.registry.hearing.ticket()
    )
    assert world.clock.advance(0) == 0 and world.upstream.calls == [], "what the poll saw decides: it only reads now"
    await world.registry.aclose()
    assert failures(caplog) == []
