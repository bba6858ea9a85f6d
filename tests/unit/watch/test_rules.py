"""`polling.rules` on their own: which rule a URI falls under, and what of a read counts as a change."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.config.polling_rules import PollingRule
from sidecar.watch.observation import observation_from_read
from sidecar.watch.rules import NO_RULES, Rule, Rules


def _rules(*rules: dict[str, Any]) -> Rules:
    return Rules([PollingRule.model_validate(rule) for rule in rules])


def _read(text: str, **item: Any) -> dict[str, Any]:
    return {"contents": [{"uri": "report://daily", "text": text, **item}]}


def test_the_first_rule_whose_glob_fits_wins_and_star_crosses_slashes() -> None:
    rules = _rules({"match": "report://daily/*", "interval_ms": 1}, {"match": "report://*", "interval_ms": 2})
    assert rules.for_uri("report://daily/2026/05") is not None
    assert rules.for_uri("report://daily/2026/05").interval_ms == 1  # type: ignore[union-attr]
    assert rules.for_uri("report://weekly").interval_ms == 2  # type: ignore[union-attr]
    assert rules.for_uri("other://daily") is None
    assert _rules({"match": "a.b://x?"}).for_uri("aXb://xy") is None, "only * is special"


def test_ignored_json_members_are_no_change_but_the_rest_is() -> None:
    rule = _rules({"match": "*", "ignore": {"json_pointers": ["/generatedAt", "/items/0/seen", "/a~1b"]}}).for_uri("x")
    base = observation_from_read(
        _read('{"total": 1, "generatedAt": 1, "items": [{"seen": 1, "n": 1}], "a/b": 1}'), rule
    )
    noise = observation_from_read(
        _read('{"items": [{"n": 1, "seen": 2}], "generatedAt": 2, "total": 1, "a/b": 2}'), rule
    )
    real = observation_from_read(
        _read('{"total": 2, "generatedAt": 2, "items": [{"seen": 2, "n": 1}], "a/b": 2}'), rule
    )
    assert base.fingerprint == noise.fingerprint != real.fingerprint
    assert (
        observation_from_read(_read('{"total": 1, "generatedAt": 1}')).fingerprint
        != observation_from_read(_read('{"total": 1, "generatedAt": 2}')).fingerprint
    ), "without the rule the stamp is a change"


def test_ignored_patterns_are_removed_from_text_and_pointers_from_structured_content() -> None:
    rule = _rules(
        {"match": "*", "ignore": {"patterns": [r"generated at \S+"], "json_pointers": ["/requestId"]}}
    ).for_uri("x")
    one = observation_from_read(_read("price 10, generated at 10:00", structured={"requestId": 1, "p": 10}), rule)
    two = observation_from_read(_read("price 10, generated at 10:01", structured={"requestId": 2, "p": 10}), rule)
    three = observation_from_read(_read("price 11, generated at 10:02", structured={"requestId": 3, "p": 10}), rule)
    assert one.fingerprint == two.fingerprint != three.fingerprint


def test_text_that_is_not_json_keeps_its_pointers_harmless() -> None:
    rule = _rules({"match": "*", "ignore": {"json_pointers": ["/a"]}}).for_uri("x")
    assert (
        observation_from_read(_read("not json"), rule).fingerprint
        != observation_from_read(_read("not json!"), rule).fingerprint
    )


def test_a_rule_never_changes_what_a_client_reads() -> None:
    rule = _rules({"match": "*", "ignore": {"json_pointers": ["/s"], "patterns": ["x"]}}).for_uri("x")
    result = _read('{"s": 1, "t": "x"}', structured={"s": 1})
    observation_from_read(result, rule)
    assert result == _read('{"s": 1, "t": "x"}', structured={"s": 1})


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        ({"match": ""}, "empty glob"),
        ({"match": "a\tb"}, "whitespace"),
        ({"match": "*", "ignore": {"json_pointers": [""]}}, "starts with '/'"),
        ({"match": "*", "ignore": {"json_pointers": ["/a~2"]}}, "'~' must be written"),
        ({"match": "*", "ignore": {"patterns": ["(unclosed"]}}, "not a regular expression"),
        ({"match": "*", "interval_ms": 0}, "greater than or equal to 1"),
    ],
)
def test_a_bad_rule_is_refused_naming_the_problem(rule: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        PollingRule.model_validate(rule)


def _fingerprint(rule: Rule | None, *items: Any) -> bytes | str:
    return observation_from_read({"contents": list(items)}, rule).fingerprint


def _ignoring(*pointers: str, patterns: tuple[str, ...] = ()) -> Rule:
    rule = _rules({"match": "*", "ignore": {"json_pointers": list(pointers), "patterns": list(patterns)}}).for_uri("x")
    assert rule is not None
    return rule


def test_no_rules_configured_means_no_uri_has_one() -> None:
    assert not NO_RULES and NO_RULES.for_uri("report://daily") is None
    assert _rules({"match": "*"}) and _rules({"match": "*"}).for_uri(None) is None
    assert _rules({"match": "report://*"}).for_uri("report://a\nb") is not None, "a star crosses line breaks too"


def test_a_pointer_escapes_tilde_and_slash_in_member_names() -> None:
    rule = _ignoring("/a~0b", "/c~1d")
    one = _read('{"a~b": 1, "c/d": 1, "n": 1}')
    two = _read('{"a~b": 2, "c/d": 2, "n": 1}')
    assert observation_from_read(one, rule).fingerprint == observation_from_read(two, rule).fingerprint
    assert (
        observation_from_read(one, rule).fingerprint
        != observation_from_read(_read('{"a~b": 1, "c/d": 1, "n": 2}'), rule).fingerprint
    )


def test_a_pointer_removes_a_list_element_by_index() -> None:
    rule = _ignoring("/items/1")
    assert _fingerprint(rule, {"text": '{"items": [1, 2]}'}) == _fingerprint(rule, {"text": '{"items": [1, 3]}'})
    assert _fingerprint(rule, {"text": '{"items": [1, 2]}'}) != _fingerprint(rule, {"text": '{"items": [0, 2]}'})


@pytest.mark.parametrize(
    "pointer",
    ["/items/1/n", "/items/x/n", "/total/0/n", "/items/1", "/items/x", "/total/0", "/gone", "/gone/n"],
    ids=["index-past-end", "name-in-list", "through-number", "last-past-end", "last-name-in-list", "last-in-number",
         "absent", "through-absent"],
)  # fmt: skip
def test_a_pointer_to_nothing_removes_nothing_and_every_real_change_still_counts(pointer: str) -> None:
    rule = _ignoring(pointer)
    base = _fingerprint(rule, {"text": '{"total": 5, "items": [{"n": 1}]}'})
    assert base == _fingerprint(rule, {"text": '{"items": [{"n": 1}], "total": 5}'})
    assert base != _fingerprint(rule, {"text": '{"total": 5, "items": [{"n": 2}]}'})
    assert base != _fingerprint(rule, {"text": '{"total": 6, "items": [{"n": 1}]}'})


def test_an_ignored_pattern_that_comes_and_goes_is_no_change() -> None:
    rule = _ignoring(patterns=(r" \(cached\)",))
    assert _fingerprint(rule, {"text": "price 10 (cached)"}) == _fingerprint(rule, {"text": "price 10"})
    assert _fingerprint(rule, {"text": "price 10"}) != _fingerprint(rule, {"text": "price 11"})


def test_a_rule_ignores_only_in_text_and_structured_members_and_the_rest_of_an_item_counts() -> None:
    rule = _ignoring("/stamp", patterns=("v[0-9]",))
    one = {"uri": "x", "title": "v1", "text": "v1", "structured": {"stamp": 1, "p": 1}}
    assert _fingerprint(rule, one) == _fingerprint(rule, {**one, "text": "v2", "structured": {"stamp": 2, "p": 1}})
    assert _fingerprint(rule, one) != _fingerprint(rule, {**one, "title": "v2"}), "a pattern is for the text only"
    assert _fingerprint(rule, one) != _fingerprint(rule, {**one, "structured": {"stamp": 1, "p": 2}})
    assert _fingerprint(rule, one) != _fingerprint(rule, {**one, "blob": "YQ=="})


def test_items_that_are_not_objects_and_contents_that_are_not_a_list_count_whole() -> None:
    rule = _ignoring("/stamp", patterns=("v[0-9]",))
    assert _fingerprint(rule, "v1", {"text": "a"}) != _fingerprint(rule, "v2", {"text": "a"})
    assert _fingerprint(rule, "v1", {"text": "a"}) != _fingerprint(rule, "v1", {"text": "b"})
    assert rule.significant({"text": "v1"}) == {"text": "v1"}
    assert rule.significant(None) is None


def test_the_rule_of_a_uri_is_remembered_for_a_bounded_number_of_uris() -> None:
    rules = _rules({"match": "report://*", "interval_ms": 5})
    for n in range(4100):  # a sidecar watching ever new URIs keeps a bounded memory of their rules
        assert rules.for_uri(f"report://{n}") is not None
    assert rules.for_uri.cache_info().currsize == 4096
