"""Bucket names: a bucket's keys and channel share one hash tag (one slot on Redis Cluster)."""

from __future__ import annotations

import re

from sidecar.bus.layout import Interest, Layout, decode, encode_event, encode_interest
from sidecar.changes import ChangeEvent, WatchKey


def _tag(name: str) -> str:
    match = re.search(r"\{([^}]*)\}", name)
    assert match is not None, name
    return match.group(1)


def test_a_buckets_interest_state_and_channel_share_one_hash_tag() -> None:
    layout = Layout(64)
    bucket = layout.bucket("resource", "catalog://price")
    names = [layout.interest(bucket, "h"), layout.state(bucket, "h"), layout.channel(bucket)]
    assert len({_tag(name) for name in names}) == 1
    assert layout.bucket_of_channel(layout.channel(bucket).encode()) == bucket


def test_every_context_of_a_uri_is_in_the_uri_bucket() -> None:
    layout = Layout()
    keys = [WatchKey("resource", "catalog://items/7", context) for context in ("public", "ctx-a", "ctx-b")]
    assert {layout.bucket_of(key) for key in keys} == {layout.bucket("resource", "catalog://items/7")}


def test_keys_spread_over_the_buckets() -> None:
    layout = Layout(16)
    counts = [0] * 16
    for n in range(1600):
        counts[layout.bucket("resource", f"catalog://items/{n}")] += 1
    assert min(counts) > 60 and max(counts) < 140, counts


def test_messages_round_trip() -> None:
    event = ChangeEvent(WatchKey("tools_list", None, "public"), "f1", 3, 12.5)
    assert decode(encode_event(event, "r1")) == ("r1", event)
    interest = Interest("r2", "abc", False)
    assert decode(encode_interest(interest)) == ("r2", interest)
