"""One look at the upstream: a resource read or every page of a list, as one fingerprint, read from a scripted
upstream (what the watch engine asks and what it makes of each answer)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from sidecar.changes import WatchKind
from sidecar.identity import Identity
from sidecar.protocol.errors import UpstreamBadResponse, UpstreamRpcError, UpstreamUnavailable
from sidecar.upstream.base import Upstream
from sidecar.watch.fingerprint import ABSENT, fingerprint_contents, fingerprint_items
from sidecar.watch.observation import Observation, is_not_found, observation_from_read
from sidecar.watch.observe import MAX_LIST_PAGES, observe
from tests.unit.watch.scripted_upstream import URL, ScriptedUpstream, contents

ALICE = Identity("alice", (("authorization", "Bearer a"),), client="alice-laptop")
DOC = "file:///doc"


async def _observe(upstream: ScriptedUpstream, kind: WatchKind, uri: str | None = None) -> Observation:
    return await observe(cast(Upstream, upstream), kind, uri, ALICE)


async def test_a_resource_read_as_the_identity_is_its_contents_fingerprint_ttl_and_scope() -> None:
    upstream = ScriptedUpstream()
    upstream.resources[DOC] = contents(DOC, "v1", ttlMs=1500, cacheScope="public")
    observation = await _observe(upstream, "resource", DOC)
    assert observation == Observation(fingerprint_contents(contents(DOC, "v1")["contents"]), 1500, True)
    assert observation.found
    assert upstream.calls == [("resources/read", DOC, "alice")]


@pytest.mark.parametrize("code", [-32602, -32002])
async def test_a_resource_the_upstream_does_not_find_is_absent_not_an_error(code: int) -> None:
    upstream = ScriptedUpstream()
    upstream.errors["resources/read"] = {"code": code, "message": "Resource not found"}
    observation = await _observe(upstream, "resource", DOC)
    assert observation == Observation(ABSENT, None, False)
    assert not observation.found


async def test_any_other_error_of_a_first_read_is_raised() -> None:
    upstream = ScriptedUpstream()
    upstream.errors["resources/read"] = {"code": -32603, "message": "Internal error"}
    with pytest.raises(UpstreamRpcError):
        await _observe(upstream, "resource", DOC)
    upstream.errors.clear()
    upstream.failure = UpstreamUnavailable(URL, "connection refused")
    with pytest.raises(UpstreamUnavailable):
        await _observe(upstream, "resource", DOC)


async def test_an_error_a_poll_reads_is_the_resources_state_by_code_and_message() -> None:
    upstream = ScriptedUpstream()

    async def poll(error: dict[str, Any]) -> Observation:
        upstream.errors["resources/read"] = error
        return await observe(cast(Upstream, upstream), "resource", DOC, ALICE, errors_are_states=True)

    gone = await poll({"code": -32603, "message": "note not found", "data": {"at": 1}})
    assert gone.error and not gone.public and gone.ttl_ms is None
    assert gone == await poll({"code": -32603, "message": "note not found", "data": {"at": 2}}), "data is not state"
    assert gone != await poll({"code": -32603, "message": "index rebuilding"})
    assert gone != await poll({"code": -32000, "message": "note not found"})
    assert (await poll({"code": -32002, "message": "Resource not found"})).fingerprint == ABSENT, "not-found as ever"
    upstream.failure = UpstreamRpcError(URL, {"code": -32603, "message": "note not found"}, http_status=503)
    with pytest.raises(UpstreamRpcError):
        await poll({"code": -32603, "message": "note not found"})  # with an HTTP 5xx: a fault of the upstream


def test_is_not_found_knows_the_two_not_found_codes() -> None:
    assert is_not_found(UpstreamRpcError(URL, {"code": -32602}))
    assert is_not_found(UpstreamRpcError(URL, {"code": -32002}))
    assert not is_not_found(UpstreamRpcError(URL, {"code": -32603}))


@pytest.mark.parametrize(
    ("result", "ttl_ms", "public"),
    [
        ({"ttlMs": 1}, 1, False),
        ({"ttlMs": 0}, None, False),
        ({"ttlMs": -5}, None, False),
        ({"ttlMs": True}, None, False),
        ({"ttlMs": 2.5}, None, False),
        ({"ttlMs": "1000"}, None, False),
        ({}, None, False),
        ({"cacheScope": "public"}, None, True),
        ({"cacheScope": "private"}, None, False),
        ({"cacheScope": "PUBLIC"}, None, False),
    ],
)
def test_a_read_result_gives_its_freshness_hint_and_scope(result: dict[str, Any], ttl_ms: int, public: bool) -> None:
    observation = observation_from_read({"contents": [{"uri": DOC, "text": "v1"}], **result})
    assert observation.ttl_ms == ttl_ms
    assert observation.public is public
    assert observation.fingerprint == fingerprint_contents([{"uri": DOC, "text": "v1"}])


async def test_content_that_cannot_be_fingerprinted_is_a_bad_answer() -> None:
    upstream = ScriptedUpstream()
    deep: object = "leaf"
    for _ in range(300):  # orjson writes 254 levels at most
        deep = [deep]
    upstream.resources[DOC] = {"contents": deep}
    with pytest.raises(UpstreamBadResponse) as raised:
        await _observe(upstream, "resource", DOC)
    assert raised.value.upstream == URL
    assert raised.value.reason == "content nested too deeply to fingerprint"


@pytest.mark.parametrize(
    ("kind", "method", "field"),
    [("tools_list", "tools/list", "tools"), ("prompts_list", "prompts/list", "prompts")],
)
async def test_a_list_is_every_item_of_every_page_in_order(kind: WatchKind, method: str, field: str) -> None:
    upstream = ScriptedUpstream()
    upstream.pages[method] = [
        {field: [{"name": "a"}, {"name": "b"}], "nextCursor": "1", "ttlMs": 3000, "cacheScope": "public"},
        {field: [{"name": "c"}], "nextCursor": "2", "ttlMs": 2000, "cacheScope": "public"},
        {field: [{"name": "d"}], "ttlMs": 4000, "cacheScope": "public"},
    ]
    observation = await _observe(upstream, kind)
    items = [(method, {"name": name}) for name in "abcd"]
    assert observation == Observation(fingerprint_items(items), 2000, True), "the shortest ttl of any page"
    assert upstream.calls == [(method, None, "alice"), (method, "1", "alice"), (method, "2", "alice")]


async def test_a_list_is_public_only_when_every_page_is() -> None:
    upstream = ScriptedUpstream()
    upstream.pages["tools/list"] = [
        {"tools": [{"name": "a"}], "nextCursor": "1", "cacheScope": "public"},
        {"tools": [{"name": "b"}]},
    ]
    observation = await _observe(upstream, "tools_list")
    assert observation.public is False
    assert observation.ttl_ms is None
    upstream.pages["tools/list"] = [{"tools": [], "cacheScope": "private", "nextCursor": 7}]
    observation = await _observe(upstream, "tools_list")
    assert observation == Observation(fingerprint_items([]), None, False), "a cursor that is not a string ends it"


async def test_a_page_without_a_list_of_items_adds_none() -> None:
    upstream = ScriptedUpstream()
    upstream.pages["tools/list"] = [{"tools": {"name": "a"}, "nextCursor": "1"}, {"tools": [{"name": "b"}]}]
    observation = await _observe(upstream, "tools_list")
    assert observation.fingerprint == fingerprint_items([("tools/list", {"name": "b"})])


async def test_the_resource_list_counts_the_templates_too() -> None:
    upstream = ScriptedUpstream()
    upstream.pages["resources/list"] = [{"resources": [{"uri": DOC}]}]
    upstream.pages["resources/templates/list"] = [
        {"resourceTemplates": [{"uriTemplate": "file:///{a}"}], "nextCursor": "1", "ttlMs": 700},
        {"resourceTemplates": [{"uriTemplate": "file:///{b}"}]},
    ]
    observation = await _observe(upstream, "resources_list")
    items = [
        ("resources/list", {"uri": DOC}),
        ("resources/templates/list", {"uriTemplate": "file:///{a}"}),
        ("resources/templates/list", {"uriTemplate": "file:///{b}"}),
    ]
    assert observation == Observation(fingerprint_items(items), 700, False)
    assert [method for method, _, _ in upstream.calls] == [
        "resources/list",
        "resources/templates/list",
        "resources/templates/list",
    ]


async def test_an_upstream_without_templates_lists_its_resources_alone() -> None:
    upstream = ScriptedUpstream()
    upstream.pages["resources/list"] = [{"resources": [{"uri": DOC}], "cacheScope": "public"}]
    observation = await _observe(upstream, "resources_list")  # templates/list answers -32601
    assert observation == Observation(fingerprint_items([("resources/list", {"uri": DOC})]), None, True)


async def test_a_list_method_the_upstream_lacks_is_an_error_but_for_templates() -> None:
    upstream = ScriptedUpstream()
    with pytest.raises(UpstreamRpcError):
        await _observe(upstream, "resources_list")
    upstream.pages["resources/list"] = [{"resources": []}]
    upstream.errors["resources/templates/list"] = {"code": -32603, "message": "Internal error"}
    with pytest.raises(UpstreamRpcError):
        await _observe(upstream, "resources_list")


async def test_a_list_of_exactly_the_most_pages_is_read_and_one_longer_is_a_bad_answer() -> None:
    upstream = ScriptedUpstream()
    pages = [{"tools": [{"name": str(n)}], "nextCursor": str(n + 1)} for n in range(MAX_LIST_PAGES + 1)]
    upstream.pages["tools/list"] = [*pages[: MAX_LIST_PAGES - 1], {"tools": [{"name": "last"}]}]
    assert (await _observe(upstream, "tools_list")).found
    assert len(upstream.calls) == MAX_LIST_PAGES == 100
    upstream.calls.clear()
    upstream.pages["tools/list"] = pages
    with pytest.raises(UpstreamBadResponse) as raised:
        await _observe(upstream, "tools_list")
    assert raised.value.upstream == URL
    assert raised.value.reason == "tools/list has more than 100 pages"
    assert len(upstream.calls) == 100
