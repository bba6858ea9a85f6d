"""The `revalidate` section: which tool calls make the watches look, where the upstream's tools list does not say.

A `tools/call` of a tool whose `tools/list` entry carries `annotations.readOnlyHint: true` makes no watch look;
every other one does. `revalidate.tools` overrides that either way, per tool name, for servers that set no
annotations or set them wrongly: the first rule whose `match` (a glob in which `*` matches any run of characters,
nothing else special) fits the tool's name wins. A bad rule fails at start naming `revalidate.tools[i]...`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from sidecar.config.base import Section

__all__ = ["RevalidateConfig", "ToolRule", "check_tool_glob"]


def check_tool_glob(value: str) -> str:
    if not value:
        raise ValueError("an empty glob matches no tool name")
    if any(char.isspace() or not char.isprintable() for char in value):
        raise ValueError(f"{value!r}: a tool name glob holds no whitespace or control characters")
    return value


class ToolRule(Section):
    match: Annotated[str, AfterValidator(check_tool_glob)] = Field(
        description="The tool names it applies to: a glob in which * matches any run of characters."
    )
    revalidate: bool = Field(
        description="true: a call makes the watches look (the tool may write); false: it makes none look (it only "
        "reads), whatever the tool's readOnlyHint says."
    )


class RevalidateConfig(Section):
    tools: list[ToolRule] = Field(
        default_factory=list,
        description="Per tool name, the first whose match fits wins: {match: GLOB, revalidate: true|false}; a tool "
        "no rule fits revalidates unless its tools/list entry says readOnlyHint: true.",
    )
