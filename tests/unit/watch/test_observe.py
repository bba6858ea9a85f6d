"""One look at the upstream: a resource read or every page of a list, as one fingerprint.

What an answer or an error means is decided with no I/O and tested here synchronously (`read_failed`,
`observation_from_read`; a list's pages in test_list_walk.py); the async tests read a scripted upstream and prove
that `observe` asks as the identity, in order, and carries those decisions out (a state returned, a fault raised).
"""

from __future__ import annotations

from typing import Any, cast

import pytest

from sidecar.changes import WatchKind
from sidecar.identity import Identity
from sidecar.protocol.errors import UpstreamBadResponse, UpstreamRpcError, UpstreamUnavailable
from sidecar.upstream.base import Upstream
from sidecar.watch.fingerprint import ABSENT, fingerprint_contents, fingerprint_error, fingerprint_items
from sidecar.watch.list_walk import MAX_LIST_PAGES
from sidecar.watch.observation import Observation, is_not_found, observation_from_read, read_failed
from sidecar.watch.observe import observe
from tests.unit.watch.scripted_upstream import URL, ScriptedUpstream, contents

ALICE = Identity("alice", (("authorization", "Bearer a"),), client="alice-laptop")
DOC = "file:///doc"


async def _observe(upstream: ScriptedUpstream, kind: WatchKind, uri: str | None = None) -> Observation:
    return await observe(cast(Upstream, upstream), kind, uri, ALICE)


def _error(code: int, message: str, **extra: Any) -> UpstreamRpcError:
    return UpstreamRpcError(URL, {"code": code, "message": message, **extra})


async def test_a_resource_read_as_the_identity_is_its_contents_fingerprint_ttl_and_scope() -> None:
    upstream = ScriptedUpstream()
    upstream.resources[DOC] = contents(DOC, "v1", ttlMs=1500, cacheScope="public")
    observation = await _observe(upstream, "resource", DOC)
    assert observation == Observation(fingerprint_contents(contents(DOC, "v1")["contents"]), 1500, True)
    assert observation.found
    assert upstream.calls == [("resources/read", DOC, "alice")]


@pytest.mark.parametrize("code", [-32602, -32002])
@pytest.mark.parametrize("errors_are_states", [False, True])
def test_a_resource_the_upstream_does_not_find_is_absent_not_an_error(code: int, errors_are_states: bool) -> None:
    seen = read_failed(_error(code, "Resource not found"), errors_are_states=errors_are_states)
    assert seen == Observation(ABSENT, None, False)
    assert not seen.found


def test_any_other_error_of_a_first_read_is_the_looks_to_raise() -> None:
    assert read_failed(_error(-32603, "Internal error"), errors_are_states=False) is None


@pytest.mark.invariant(24)
def test_an_error_a_poll_reads_is_the_resources_state_by_code_and_message() -> None:
    def poll(error: UpstreamRpcError) -> Observation | None:
        return read_failed(error, errors_are_states=True)

    gone = poll(_error(-32603, "note not found", data={"at": 1}))
    assert gone is not None and gone.error and not gone.public and gone.ttl_ms is None
    assert gone == poll(_error(-32603, "note not found", data={"at": 2})), "data is not state"
    assert gone != poll(_error(-32603, "index rebuilding"))
    assert gone != poll(_error(-32000, "note not found"))
    assert gone == Observation(fingerprint_error(-32603, "note not found"), None, False)
    assert poll(_error(-32002, "Resource not found")) == Observation(ABSENT, None, False), "not-found as ever"
    with_5xx = UpstreamRpcError(URL, {"code": -32603, "message": "note not found"}, http_status=503)
    assert poll(with_5xx) is None, "with an HTTP 5xx: a fault of the upstream, raised"


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


def test_content_that_cannot_be_fingerprinted_is_a_bad_answer() -> None:
    deep: object = "leaf"
    for _ in range(300):  # orjson writes 254 levels at most
        deep = [deep]
    with pytest.raises(ValueError, match=r"^content nested too deeply to fingerprint$"):
        observation_from_read({"contents": deep})


async def test_a_read_error_is_absent_a_state_or_raised_as_the_look_asks() -> None:
    upstream = ScriptedUpstream()
    assert await _observe(upstream, "resource", DOC) == Observation(ABSENT, None, False)  # not found
    upstream.errors["resources/read"] = {"code": -32603, "message": "note not found"}
    with pytest.raises(UpstreamRpcError):
        await _observe(upstream, "resource", DOC)
    as_poll = await observe(cast(Upstream, upstream), "resource", DOC, ALICE, errors_are_states=True)
    assert as_poll == Observation(fingerprint_error(-32603, "note not found"), None, False)
    upstream.failure = UpstreamRpcError(URL, {"code": -32603, "message": "note not found"}, http_status=503)
    with pytest.raises(UpstreamRpcError):
        await observe(cast(Upstream, upstream), "resource", DOC, ALICE, errors_are_states=True)
    upstream.failure = UpstreamUnavailable(URL, "connection refused")
    with pytest.raises(UpstreamUnavailable):
        await observe(cast(Upstream, upstream), "resource", DOC, ALICE, errors_are_states=True)
    assert upstream.reads(DOC) == ["alice"] * 5


async def test_a_list_look_asks_for_every_page_in_order_as_the_identity_and_tells_listed() -> None:
    upstream = ScriptedUpstream()
    upstream.pages["resources/list"] = [
        {"resources": [{"uri": DOC}], "nextCursor": "1", "ttlMs": 900, "cacheScope": "public"},
        {"resources": [{"uri": "file:///b"}], "cacheScope": "public"},
    ]
    told: list[tuple[list[Any], bool]] = []

    def listed(items: list[Any], public: bool) -> None:
        told.append((items, public))

    observation = await observe(cast(Upstream, upstream), "resources_list", None, ALICE, listed=listed)
    items = [("resources/list", {"uri": DOC}), ("resources/list", {"uri": "file:///b"})]
    assert observation == Observation(fingerprint_items(items), 900, True)
    assert upstream.calls == [
        ("resources/list", None, "alice"),
        ("resources/list", "1", "alice"),
        ("resources/templates/list", None, "alice"),  # answers -32601: read without templates
    ]
    assert told == [([{"uri": DOC}, {"uri": "file:///b"}], True)]
    upstream.errors["resources/templates/list"] = {"code": -32603, "message": "Internal error"}
    with pytest.raises(UpstreamRpcError):
        await _observe(upstream, "resources_list")
    with pytest.raises(UpstreamRpcError):
        await _observe(upstream, "tools_list")  # a list the upstream lacks
    assert len(told) == 1, "listed is told only of a list read to its end"


async def test_an_answer_the_look_cannot_use_is_a_bad_answer_of_the_upstream() -> None:
    upstream = ScriptedUpstream()
    deep: object = "leaf"
    for _ in range(300):  # orjson writes 254 levels at most
        deep = [deep]
    upstream.resources[DOC] = {"contents": deep}
    with pytest.raises(UpstreamBadResponse) as raised:
        await _observe(upstream, "resource", DOC)
    assert raised.value.upstream == URL
    assert raised.value.reason == "content nested too deeply to fingerprint"
    upstream.calls.clear()
    pages = [{"tools": [{"name": str(n)}], "nextCursor": str(n + 1)} for n in range(MAX_LIST_PAGES + 1)]
    upstream.pages["tools/list"] = pages
    with pytest.raises(UpstreamBadResponse) as raised:
        await _observe(upstream, "tools_list")
    assert raised.value.upstream == URL
    assert raised.value.reason == "tools/list has more than 100 pages"
    assert [cursor for _, cursor, _ in upstream.calls] == [None, *(str(n) for n in range(1, MAX_LIST_PAGES))]
