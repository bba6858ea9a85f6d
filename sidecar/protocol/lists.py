"""The three list kinds, each described once: every place that handles lists reads this table.

A list kind is a watch on one of the upstream's lists (tools, prompts, resources). The table says, for each,
the capability it needs (`primitive`, also its name in a hint and on the command line), the field that asks
for it in a listen's filter, the methods a look walks (each with the field its items are under) and the
notification its change sends. Resources walk two methods: a template-list change is announced as a resources
list change (SEP-2549).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

__all__ = [
    "LIST_KINDS",
    "LIST_KIND_OF_METHOD",
    "LIST_KIND_OF_NOTIFICATION",
    "LIST_KIND_OF_PRIMITIVE",
    "ListKind",
    "ListKindRow",
    "ListMethod",
    "ListPrimitive",
    "synthesise_capabilities",
]

ListKind = Literal["tools_list", "prompts_list", "resources_list"]
ListPrimitive = Literal["tools", "prompts", "resources"]


class ListMethod(NamedTuple):
    """One method a look at a list walks page by page, and the result field its items are under."""

    method: str
    items_field: str


@dataclass(frozen=True, slots=True)
class ListKindRow:
    kind: ListKind
    primitive: ListPrimitive
    """The capability the upstream must declare for this kind; also the list's name in a hint."""
    filter_field: str
    """The field of a listen's filter (`SubscriptionFilter`) that asks for it."""
    methods: tuple[ListMethod, ...]
    notification_method: str


LIST_KINDS: dict[str, ListKindRow] = {
    row.kind: row
    for row in (
        ListKindRow(
            "tools_list",
            "tools",
            "toolsListChanged",
            (ListMethod("tools/list", "tools"),),
            "notifications/tools/list_changed",
        ),
        ListKindRow(
            "prompts_list",
            "prompts",
            "promptsListChanged",
            (ListMethod("prompts/list", "prompts"),),
            "notifications/prompts/list_changed",
        ),
        ListKindRow(
            "resources_list",
            "resources",
            "resourcesListChanged",
            (ListMethod("resources/list", "resources"), ListMethod("resources/templates/list", "resourceTemplates")),
            "notifications/resources/list_changed",
        ),
    )
}
"""Every list kind by its name (a `WatchKind`), in the order acks and metrics list them."""

LIST_KIND_OF_METHOD: dict[str, ListKind] = {
    method.method: row.kind for row in LIST_KINDS.values() for method in row.methods
}
LIST_KIND_OF_NOTIFICATION: dict[str, ListKind] = {row.notification_method: row.kind for row in LIST_KINDS.values()}
LIST_KIND_OF_PRIMITIVE: dict[ListPrimitive, ListKind] = {row.primitive: row.kind for row in LIST_KINDS.values()}


def synthesise_capabilities(capabilities: dict[str, Any]) -> None:
    """What the sidecar adds to the upstream's capabilities (in place): `listChanged` on every list primitive the
    upstream has, and `subscribe` on its resources."""
    for primitive in LIST_KIND_OF_PRIMITIVE:
        declared = capabilities.get(primitive)
        if isinstance(declared, dict):
            declared["listChanged"] = True
    resources = capabilities.get("resources")
    if isinstance(resources, dict):
        resources["subscribe"] = True
