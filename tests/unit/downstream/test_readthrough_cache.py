"""The response cache of the read-through path, with no socket: what it keeps, for whom, for how long, and what
a change or a newer look drops (invariants 5 and 17); the requests behind it are in-process forwards."""

from __future__ import annotations

import pytest

from sidecar.changes import ChangeEvent, WatchKey
from sidecar.downstream.readthrough import is_shareable
from sidecar.watch.fingerprint import fingerprint_contents
from tests.unit.downstream.readthrough_kit import READ, Clock, cache, result, sample, store

HITS = "mcp_sidecar_cache_hits_total"
MISSES = "mcp_sidecar_cache_misses_total"


@pytest.mark.parametrize(
    ("method", "params", "shareable"),
    [
        ("resources/read", {"uri": "x://a"}, True),
        ("tools/list", {}, True),
        ("tools/call", {"name": "t"}, False),
        ("resources/read", {"uri": "x://a", "inputResponses": {}}, False),
        ("resources/read", {"uri": "x://a", "requestState": "s"}, False),
        ("resources/read", {"uri": "x://a", "_meta": {"progressToken": 1}}, False),
        ("resources/read", {"uri": "x://a", "_meta": {"other": 1}}, True),
        ("resources/read", {"uri": "x://a", "_meta": "progressToken"}, True),
    ],
)
def test_only_cacheable_requests_without_retry_state_or_progress_are_shared(
    method: str, params: dict[str, object], shareable: bool
) -> None:
    assert is_shareable(method, params) is shareable


async def test_a_cached_answer_is_served_with_what_is_left_of_its_freshness() -> None:
    clock = Clock()
    rt, metrics = cache(clock)
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") is None
    assert sample(metrics, MISSES) == 1, "an empty cache is a miss too"
    await store(rt, result(ttl=10_000))
    clock.now += 2.5
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") == result(ttl=7_500)
    assert rt.lookup(READ, {"uri": "x://a", "_meta": {"progressToken": 1}}, "alice") is not None, "_meta is no key"
    assert sample(metrics, HITS) == 2
    assert rt.lookup(READ, {"uri": "x://b"}, "alice") is None
    assert sample(metrics, MISSES) == 2
    clock.now += 7.5
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") is None, "expired"


async def test_the_freshness_left_is_never_negative() -> None:
    clock = Clock()
    rt, _ = cache(clock)
    await store(rt, result(ttl=1_000))
    clock.now += 0.9995
    answer = rt.lookup(READ, {"uri": "x://a"}, "alice")
    assert answer is not None and answer["ttlMs"] == 0


async def test_a_private_answer_is_its_contexts_alone() -> None:
    rt, _ = cache()
    await store(rt, result(), context="alice")
    assert rt.lookup(READ, {"uri": "x://a"}, "bob") is None
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") is not None


@pytest.mark.invariant(10)
async def test_a_public_answer_reaches_only_contexts_the_upstream_answered_unless_configured_otherwise() -> None:
    rt, _ = cache()
    await store(rt, result(scope="public"), context="alice")
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") is not None
    assert rt.lookup(READ, {"uri": "x://a"}, "bob") is None, "the upstream never answered bob: it may refuse him"
    await store(rt, result(scope="public"), context="bob")
    assert rt.lookup(READ, {"uri": "x://a"}, "bob") is not None
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") is not None, "a refresh keeps the contexts verified before"
    rt.refused(READ, {"uri": "x://a"}, "bob")
    assert rt.lookup(READ, {"uri": "x://a"}, "bob") is None, "refused since: it proves access again first"
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") is not None
    rt.refused(READ, {"uri": "x://nothing"}, "bob")  # nothing cached: nothing to do
    trusting, _ = cache(public_requires_verified_context=False)
    await store(trusting, result(scope="public"), context="alice")
    assert trusting.lookup(READ, {"uri": "x://a"}, "bob") is not None


async def test_a_public_entry_remembers_a_bounded_number_of_verified_contexts() -> None:
    rt, _ = cache()
    for n in range(4096):
        await store(rt, result(scope="public"), context=f"c{n}")
    await store(rt, result(scope="public"), context="late")
    assert rt.lookup(READ, {"uri": "x://a"}, "c4095") is not None
    assert rt.lookup(READ, {"uri": "x://a"}, "late") is None, "past the bound, a new context's read goes upstream"


@pytest.mark.parametrize(
    "answer",
    [
        result(ttl=0),
        result(ttl=-5),
        result(ttl=True),
        result(ttl=1.5),
        result(ttl="60000"),
        {k: v for k, v in result().items() if k != "ttlMs"},
        result(resultType="incomplete"),
    ],
    ids=["ttl 0", "negative ttl", "boolean ttl", "float ttl", "string ttl", "no ttl", "incomplete"],
)
async def test_an_answer_without_positive_whole_freshness_or_incomplete_is_not_kept(answer: dict[str, object]) -> None:
    rt, metrics = cache()
    await store(rt, answer)
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") is None
    assert sample(metrics, "mcp_sidecar_cache_bytes") == 0


async def test_a_complete_result_type_said_out_loud_is_kept() -> None:
    rt, _ = cache()
    await store(rt, result(resultType="complete"))
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") is not None


async def test_caching_off_keeps_and_serves_nothing() -> None:
    rt, metrics = cache(max_entries=0)
    await store(rt, result())
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") is None
    assert sample(metrics, MISSES) == 0, "not even a miss: there is no cache"


async def test_the_cache_holds_at_most_max_entries_and_max_bytes() -> None:
    rt, metrics = cache(max_entries=2)
    for uri in ("x://1", "x://2", "x://3"):
        await store(rt, result(), params={"uri": uri})
    assert rt.lookup(READ, {"uri": "x://1"}, "alice") is None, "the least recently used went"
    assert rt.lookup(READ, {"uri": "x://3"}, "alice") is not None
    assert rt.lookup(READ, {"uri": "x://2"}, "alice") is not None
    assert sample(metrics, "mcp_sidecar_cache_evictions_total") == 1
    await store(rt, result("v2"), params={"uri": "x://3"})  # a refresh of a cached key evicts nothing
    assert rt.lookup(READ, {"uri": "x://2"}, "alice") is not None
    assert sample(metrics, "mcp_sidecar_cache_evictions_total") == 1
    size = len(b'{"contents":[{"uri":"x://a","text":"v1"}],"ttlMs":60000,"cacheScope":"private"}')
    exact, metrics = cache(max_bytes=size)
    await store(exact, result())
    assert exact.lookup(READ, {"uri": "x://a"}, "alice") is not None, "an answer of exactly max_bytes fits"
    assert sample(metrics, "mcp_sidecar_cache_bytes") == size
    small, _ = cache(max_bytes=size - 1)
    await store(small, result())
    assert small.lookup(READ, {"uri": "x://a"}, "alice") is None


async def test_parameters_other_than_meta_are_part_of_the_key_in_any_order() -> None:
    rt, _ = cache()
    await store(rt, result(), method="tools/list", params={"cursor": "c1", "filter": "f"})
    assert rt.lookup("tools/list", {"filter": "f", "cursor": "c1", "_meta": {"x": 1}}, "alice") is not None
    assert rt.lookup("tools/list", {"cursor": "c2", "filter": "f"}, "alice") is None
    assert rt.lookup("prompts/list", {"cursor": "c1", "filter": "f"}, "alice") is None
    await store(rt, result(), params={"uri": "x://ü"})
    assert rt.lookup(READ, {"uri": "x://ü"}, "alice") is not None
    assert rt.lookup(READ, {"uri": "x://u"}, "alice") is None
    await store(rt, result(), params={"uri": "x://b", "extra": 1})
    assert rt.lookup(READ, {"uri": "x://b"}, "alice") is None, "another parameter is another request"
    assert rt.lookup(READ, {"uri": "x://b", "extra": 1}, "alice") is not None


async def test_parameters_nested_deeper_than_json_can_be_written_are_never_cached() -> None:
    deep: dict[str, object] = {}
    for _ in range(300):
        deep = {"d": deep}
    rt, _ = cache()
    await store(rt, result(), params={"uri": "x://a", "deep": deep})
    assert rt.lookup(READ, {"uri": "x://a", "deep": deep}, "alice") is None
    await store(rt, {**result(), "deep": deep})
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") is None, "an answer too deep to measure is not kept"


@pytest.mark.invariant(5)
async def test_a_change_drops_the_answers_of_its_key_in_every_context_and_no_other() -> None:
    rt, metrics = cache()
    await store(rt, result(), context="alice")
    await store(rt, result(), context="bob")
    await store(rt, result(), params={"uri": "x://b"})
    await store(rt, result(), method="tools/list", params={})
    rt.on_change(ChangeEvent(WatchKey("resource", "x://a", "alice"), "f", 1, 0.0))
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") is None
    assert rt.lookup(READ, {"uri": "x://a"}, "bob") is None
    assert rt.lookup(READ, {"uri": "x://b"}, "alice") is not None
    assert rt.lookup("tools/list", {}, "alice") is not None
    assert sample(metrics, "mcp_sidecar_cache_bytes") > 0
    rt.on_change(ChangeEvent(WatchKey("tools_list", None, "public"), "f", 1, 0.0))
    assert rt.lookup("tools/list", {}, "alice") is None


async def test_a_resource_list_change_drops_both_of_its_lists() -> None:
    rt, metrics = cache()
    await store(rt, result(), method="resources/list", params={})
    await store(rt, result(), method="resources/templates/list", params={})
    rt.on_change(ChangeEvent(WatchKey("resources_list", None, "alice"), "f", 1, 0.0))
    assert rt.lookup("resources/list", {}, "alice") is None
    assert rt.lookup("resources/templates/list", {}, "alice") is None
    assert sample(metrics, "mcp_sidecar_cache_bytes") == 0


@pytest.mark.invariant(17)
async def test_a_first_look_elsewhere_drops_only_the_answers_it_contradicts_in_its_context() -> None:
    rt, _ = cache()
    same = fingerprint_contents(result()["contents"])
    await store(rt, result(), context="alice")
    await store(rt, result(), context="bob")
    rt.on_change(ChangeEvent(WatchKey("resource", "x://a", "alice"), same, 1, 0.0, baseline=True))
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") is not None, "it saw what is cached"
    rt.on_change(ChangeEvent(WatchKey("resource", "x://a", "alice"), "other", 1, 0.0, baseline=True))
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") is None
    assert rt.lookup(READ, {"uri": "x://a"}, "bob") is not None, "another context's answer is its own"
    await store(rt, result(), method="tools/list", params={})
    rt.on_change(ChangeEvent(WatchKey("tools_list", None, "alice"), "any", 1, 0.0, baseline=True))
    assert rt.lookup("tools/list", {}, "alice") is None, "a list page cannot be compared with a whole list"


@pytest.mark.invariant(17)
async def test_a_newer_look_that_sees_other_content_drops_an_older_answer_and_keeps_a_newer_one() -> None:
    rt, _ = cache()
    seen = fingerprint_contents(result()["contents"])
    key = WatchKey("resource", "x://a", "alice")
    await store(rt, result(), ticket=5)
    rt.observed(key, "other", 5)
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") is not None, "a look of the same moment does not outrank it"
    rt.observed(key, seen, 6)
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") is not None, "the same content"
    rt.observed(WatchKey("resource", "x://a", "bob"), "other", 7)
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") is not None, "another context's look"
    rt.observed(key, "other", 7)
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") is None
    await store(rt, result(), ticket=6)
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") is None, "asked before that look and contradicted by it"
    await store(rt, result(), ticket=7)
    assert rt.lookup(READ, {"uri": "x://a"}, "alice") is not None, "asked at that look's moment: as new as it"
    await store(rt, result("other"), ticket=6, context="carol")
    assert rt.lookup(READ, {"uri": "x://a"}, "carol") is not None, "no look of carol's has seen it"
