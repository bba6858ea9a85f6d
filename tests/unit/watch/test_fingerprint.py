"""Fingerprints change with content and only with content."""

from __future__ import annotations

import pytest

from sidecar.watch.fingerprint import fingerprint_contents, fingerprint_items


def test_cache_hints_and_meta_do_not_change_the_fingerprint() -> None:
    a = [{"uri": "x://1", "text": "price=100", "_meta": {"ts": 1}}]
    b = [{"text": "price=100", "uri": "x://1", "_meta": {"ts": 2}}]
    assert fingerprint_contents(a) == fingerprint_contents(b)


@pytest.mark.parametrize("hint", ["_meta", "ttlMs", "cacheScope", "resultType", "nextCursor"])
def test_no_cache_hint_or_cursor_at_any_depth_changes_the_fingerprint(hint: str) -> None:
    plain = [{"uri": "x://1", "text": "price=100", "annotations": {"audience": ["user"]}}]
    hinted = [{"uri": "x://1", "text": "price=100", "annotations": {"audience": ["user"], hint: 1}, hint: 2}]
    assert fingerprint_contents(plain) == fingerprint_contents(hinted)
    assert fingerprint_items(plain) == fingerprint_items(hinted)


def test_different_text_changes_the_fingerprint() -> None:
    assert fingerprint_contents([{"text": "price=100"}]) != fingerprint_contents([{"text": "price=101"}])


def test_list_order_and_paging_do_not_change_the_fingerprint() -> None:
    tools = [{"name": "a"}, {"name": "b"}, {"name": "c"}]
    assert fingerprint_items(tools) == fingerprint_items(list(reversed(tools)))


def test_an_added_item_changes_the_list_fingerprint() -> None:
    assert fingerprint_items([{"name": "a"}]) != fingerprint_items([{"name": "a"}, {"name": "b"}])


def test_item_boundaries_are_part_of_the_fingerprint() -> None:
    assert fingerprint_items(["ab", "c"]) != fingerprint_items(["a", "bc"])


def test_content_nested_too_deeply_to_fingerprint_is_refused_not_crashed() -> None:
    deep: object = "leaf"
    for _ in range(300):
        deep = [deep]
    with pytest.raises(ValueError, match=r"^content nested too deeply to fingerprint$"):
        fingerprint_contents([{"text": deep}])


def test_fingerprints_are_the_same_in_every_release() -> None:
    # Replicas compare a poll's fingerprint with the one the bus stored beside the key (bus/layout.py), and
    # a rolling upgrade runs two releases side by side: a fingerprint that changed with the release would
    # make every watched key look changed, and every stream be told so, once per upgrade.
    assert fingerprint_contents([{"uri": "x://1", "text": "price=100"}]) == "725402450fba57592e9d816145239bb0"
    assert fingerprint_items([{"name": "a"}, {"name": "b"}]) == "1b15b8412257f9ee326d5f50756eb015"
    assert fingerprint_items([]) == "cae66941d9efbd404e4d88758ea67670"
