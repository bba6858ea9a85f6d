"""Which tool calls may write: a `tools/call` of a tool that only reads makes no watch look.

A tool only reads when the upstream's tools list marks it `annotations.readOnlyHint: true`, or a `revalidate.tools`
rule says so (the first rule whose glob fits the tool's name wins, either way, over the annotation). Any other call,
and a call of a tool no tools list has shown yet, may write: the watches look, as after any request not known to be
read-only. The call itself is forwarded as it is, whatever is decided here.

What each tools list said is kept per authorization context, from the two places the sidecar sees one: a watch's
poll of the tools list (it follows `notifications/tools/list_changed`), and a client's forwarded `tools/list`
answer. A list the upstream marks `cacheScope: public` is everyone's; any other is only its own context's, and a
call is decided on its own context's list first, then the public one: nothing one context was shown decides
another's calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

from cachetools import LRUCache

from sidecar.config import ToolRule
from sidecar.identity import PUBLIC
from sidecar.observability.metrics import TOOL_CALL_DECISIONS, Metrics
from sidecar.protocol import JsonObject
from sidecar.watch.source_hints import UriGlob

__all__ = ["Decision", "Reason", "ToolCalls", "ToolCatalog"]

Decision = Literal["revalidate", "read_only"]
Reason = Literal["annotation", "rule", "unknown"]

MAX_CONTEXTS = 4096
"""Contexts whose tools lists are remembered (least recently used go first): a forgotten context's calls revalidate,
as before any list was seen (`mcp_sidecar_tool_calls_total{reason="unknown"}`)."""
MAX_TOOLS = 4096
"""Tools remembered per context; the tools of a longer list past these are unknown, and revalidate."""


def _read_only(tool: JsonObject) -> bool:
    annotations = tool.get("annotations")
    return isinstance(annotations, dict) and annotations.get("readOnlyHint") is True


class ToolCatalog:
    """What the upstream's tools lists said of each tool, per authorization context: name -> read-only."""

    def __init__(self, max_contexts: int = MAX_CONTEXTS, max_tools: int = MAX_TOOLS) -> None:
        self._lists: LRUCache[str, dict[str, bool]] = LRUCache(maxsize=max_contexts)
        self._max_tools = max_tools

    def learn(self, context: str, tools: Iterable[Any], *, complete: bool) -> None:
        """`context` was shown `tools` (the entries of a tools list): the whole list when `complete` (a tool no
        longer in it is forgotten), else one page of it (added to what the context was shown before)."""
        known = {} if complete else dict(self._lists.get(context) or {})
        for tool in tools:
            if isinstance(tool, dict) and isinstance(name := tool.get("name"), str):
                if len(known) >= self._max_tools and name not in known:
                    break
                known[name] = _read_only(tool)
        self._lists[context] = known

    def read_only(self, context: str, name: str) -> bool | None:
        """Whether `name` is read-only as `context`'s tools list (or else the public one) says; None if neither
        has shown it."""
        for scope in (context, PUBLIC):
            known = self._lists.get(scope)
            if known is not None and name in known:
                return known[name]
        return None

    def listed(self, context: str, params: JsonObject, answer: JsonObject) -> None:
        """A forwarded `tools/list` answer: its page of tools, the whole list when it is the only page."""
        result = answer.get("result")
        if not isinstance(result, dict) or not isinstance(tools := result.get("tools"), list):
            return
        scope = PUBLIC if result.get("cacheScope") == "public" else context
        complete = params.get("cursor") is None and not isinstance(result.get("nextCursor"), str)
        self.learn(scope, tools, complete=complete)


class ToolCalls:
    """Decides, and counts, whether each forwarded `tools/call` makes the watches look."""

    def __init__(self, rules: Sequence[ToolRule], catalog: ToolCatalog, metrics: Metrics) -> None:
        self._rules = [(UriGlob(rule.match), rule.revalidate) for rule in rules]
        self.catalog = catalog
        self._counted = {labels: metrics.tool_calls.labels(*labels) for labels in TOOL_CALL_DECISIONS}

    def decide(self, name: object, context: str) -> tuple[Decision, Reason]:
        """What a call of tool `name` by `context` does to the watches, and what said so."""
        if not isinstance(name, str):
            return "revalidate", "unknown"  # the upstream will refuse it; as before, it revalidates
        for glob, revalidate in self._rules:
            if glob.matches(name):
                return ("revalidate" if revalidate else "read_only"), "rule"
        read_only = self.catalog.read_only(context, name)
        if read_only is None:
            return "revalidate", "unknown"
        return ("read_only" if read_only else "revalidate"), "annotation"

    def forwarded(self, method: str, params: JsonObject, context: str, answer: JsonObject) -> bool:
        """A forwarded request's answer was read: a tools list shows which tools only read; False for a call of
        one of those (it wrote nothing, so it teaches the watches nothing), True otherwise."""
        if method == "tools/list":
            self.catalog.listed(context, params, answer)
        elif method == "tools/call":
            return self.writes(params, context)
        return True

    def writes(self, params: JsonObject, context: str) -> bool:
        """Whether a forwarded `tools/call` with `params` may have written (counted by decision and reason)."""
        decision, reason = self.decide(params.get("name"), context)
        self._counted[decision, reason].inc()
        return decision == "revalidate"
