"""A look at a list, page by page, with no I/O: the requests the walk asks for, in order, and what the pages it
is handed add up to (every item of every page, the shortest ttl, public only when every page is)."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.changes import WatchKind
from sidecar.protocol.errors import UpstreamRpcError
from sidecar.protocol.types import JsonObject
from sidecar.watch.fingerprint import fingerprint_items
from sidecar.watch.list_walk import MAX_LIST_PAGES, ListWalk
from sidecar.watch.observation import Observation

URL = "scripted://upstream"
DOC = "file:///doc"
METHOD_NOT_FOUND = {"code": -32601, "message": "Method not found"}

Asked = list[tuple[str, JsonObject]]


def _walk(
    kind: WatchKind, pages: dict[str, list[JsonObject]], errors: dict[str, JsonObject] | None = None
) -> tuple[ListWalk, Asked]:
    """Walk `kind` to its end, answering each request as an upstream with these pages (page n asked for with the
    cursor `str(n)`) and these errors would (a method with neither answers -32601): the walk and the requests it
    asked for, in order. An error the walk does not go on past is raised, as a look raises it."""
    walk = ListWalk(kind)
    asked: Asked = []
    while (request := walk.next_request()) is not None:
        asked.append(request)
        method, params = request
        if method in pages and method not in (errors or {}):
            walk.answered(pages[method][int(params.get("cursor", 0))])
            continue
        error = UpstreamRpcError(URL, (errors or {}).get(method, METHOD_NOT_FOUND))
        if not walk.failed(error):
            raise error
    return walk, asked


@pytest.mark.parametrize(
    ("kind", "method", "field"),
    [("tools_list", "tools/list", "tools"), ("prompts_list", "prompts/list", "prompts")],
)
def test_a_list_is_every_item_of_every_page_in_order(kind: WatchKind, method: str, field: str) -> None:
    walk, asked = _walk(
        kind,
        {
            method: [
                {field: [{"name": "a"}, {"name": "b"}], "nextCursor": "1", "ttlMs": 3000, "cacheScope": "public"},
                {field: [{"name": "c"}], "nextCursor": "2", "ttlMs": 2000, "cacheScope": "public"},
                {field: [{"name": "d"}], "ttlMs": 4000, "cacheScope": "public"},
            ]
        },
    )
    items = [(method, {"name": name}) for name in "abcd"]
    assert walk.observation() == Observation(fingerprint_items(items), 2000, True), "the shortest ttl of any page"
    assert asked == [(method, {}), (method, {"cursor": "1"}), (method, {"cursor": "2"})]
    assert walk.entries() == [{"name": name} for name in "abcd"]


def test_a_list_is_public_only_when_every_page_is() -> None:
    first = {"tools": [{"name": "a"}], "nextCursor": "1", "cacheScope": "public"}
    walk, _ = _walk("tools_list", {"tools/list": [first, {"tools": [{"name": "b"}]}]})
    assert walk.observation().public is False
    assert walk.public is False
    assert walk.observation().ttl_ms is None
    walk, asked = _walk("tools_list", {"tools/list": [{"tools": [], "cacheScope": "private", "nextCursor": 7}]})
    assert walk.observation() == Observation(fingerprint_items([]), None, False), "a cursor not a string ends it"
    assert asked == [("tools/list", {})]


def test_a_page_without_a_list_of_items_adds_none() -> None:
    pages: list[JsonObject] = [{"tools": {"name": "a"}, "nextCursor": "1"}, {"tools": [{"name": "b"}]}]
    walk, _ = _walk("tools_list", {"tools/list": pages})
    assert walk.observation().fingerprint == fingerprint_items([("tools/list", {"name": "b"})])


def test_the_resource_list_counts_the_templates_too() -> None:
    walk, asked = _walk(
        "resources_list",
        {
            "resources/list": [{"resources": [{"uri": DOC}]}],
            "resources/templates/list": [
                {"resourceTemplates": [{"uriTemplate": "file:///{a}"}], "nextCursor": "1", "ttlMs": 700},
                {"resourceTemplates": [{"uriTemplate": "file:///{b}"}]},
            ],
        },
    )
    items = [
        ("resources/list", {"uri": DOC}),
        ("resources/templates/list", {"uriTemplate": "file:///{a}"}),
        ("resources/templates/list", {"uriTemplate": "file:///{b}"}),
    ]
    assert walk.observation() == Observation(fingerprint_items(items), 700, False)
    assert asked == [
        ("resources/list", {}),
        ("resources/templates/list", {}),
        ("resources/templates/list", {"cursor": "1"}),
    ]


def test_an_upstream_without_templates_lists_its_resources_alone() -> None:
    walk, asked = _walk("resources_list", {"resources/list": [{"resources": [{"uri": DOC}], "cacheScope": "public"}]})
    assert walk.observation() == Observation(fingerprint_items([("resources/list", {"uri": DOC})]), None, True)
    assert asked == [("resources/list", {}), ("resources/templates/list", {})], "templates/list answered -32601"
    assert walk.next_request() is None


def test_a_list_method_the_upstream_lacks_is_an_error_but_for_templates() -> None:
    with pytest.raises(UpstreamRpcError) as raised:
        _walk("resources_list", {})
    assert raised.value.code == -32601
    internal = {"code": -32603, "message": "Internal error"}
    with pytest.raises(UpstreamRpcError) as raised:
        _walk("resources_list", {"resources/list": [{"resources": []}]}, {"resources/templates/list": internal})
    assert raised.value.code == -32603
    with pytest.raises(UpstreamRpcError):
        _walk("tools_list", {})  # -32601 ends only a templates walk


def test_a_list_of_exactly_the_most_pages_is_read_and_one_longer_is_a_bad_answer() -> None:
    pages: list[JsonObject] = [{"tools": [{"name": str(n)}], "nextCursor": str(n + 1)} for n in range(101)]
    walk, asked = _walk("tools_list", {"tools/list": [*pages[: MAX_LIST_PAGES - 1], {"tools": [{"name": "last"}]}]})
    assert walk.observation().found
    assert len(asked) == MAX_LIST_PAGES == 100
    walk = ListWalk("tools_list")
    for page in pages[: MAX_LIST_PAGES - 1]:
        assert walk.next_request() is not None
        walk.answered(page)
    assert walk.next_request() == ("tools/list", {"cursor": "99"})
    with pytest.raises(ValueError, match=r"^tools/list has more than 100 pages$"):
        walk.answered(pages[MAX_LIST_PAGES - 1])


def test_the_templates_may_have_the_most_pages_too_after_the_resources_pages() -> None:
    # The bound is each method's own: the resources' pages do not use up the templates'.
    resources: list[JsonObject] = [{"resources": [{"uri": f"file:///{n}"}], "nextCursor": str(n + 1)} for n in range(3)]
    templates: list[JsonObject] = [
        {"resourceTemplates": [{"uriTemplate": f"file:///{n}/{{a}}"}], "nextCursor": str(n + 1)} for n in range(99)
    ]
    pages = {"resources/list": [*resources, {"resources": []}], "resources/templates/list": [*templates, {}]}
    walk, asked = _walk("resources_list", pages)
    assert len(asked) == 4 + MAX_LIST_PAGES
    assert len(walk.entries()) == 3 + 99


def test_items_that_cannot_be_fingerprinted_are_a_bad_answer() -> None:
    deep: Any = "leaf"
    for _ in range(300):  # orjson writes 254 levels at most
        deep = [deep]
    walk, _ = _walk("tools_list", {"tools/list": [{"tools": [deep]}]})
    with pytest.raises(ValueError, match=r"^content nested too deeply to fingerprint$"):
        walk.observation()
