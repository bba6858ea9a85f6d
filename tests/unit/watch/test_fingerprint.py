"""Fingerprints change with content and only with content."""

from __future__ import annotations

from sidecar.watch.fingerprint import fingerprint_contents, fingerprint_items


def test_cache_hints_and_meta_do_not_change_the_fingerprint() -> None:
    a = [{"uri": "x://1", "text": "price=100", "_meta": {"ts": 1}}]
    b = [{"text": "price=100", "uri": "x://1", "_meta": {"ts": 2}}]
    assert fingerprint_contents(a) == fingerprint_contents(b)


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
    try:
        fingerprint_contents([{"text": deep}])
    except ValueError as exc:
        assert "nested too deeply" in str(exc)
    else:
        raise AssertionError("expected a ValueError")
