"""The keys this replica watches, as the Redis bus knows them: by key, by hash (as the bus names them) and by
bucket. Written by the bus's facade alone (`track`, `untrack`); its parts read them.
"""

from __future__ import annotations

from collections.abc import Iterator

from sidecar.bus.layout import Layout, key_hash
from sidecar.changes import WatchKey, WatchState

__all__ = ["TrackedKeys"]


class TrackedKeys:
    """Each tracked key's watch, and the keys by hash and by bucket."""

    def __init__(self, layout: Layout) -> None:
        self._layout = layout
        self._watches: dict[WatchKey, WatchState] = {}
        self._by_hash: dict[str, WatchKey] = {}
        self._by_bucket: dict[int, set[WatchKey]] = {}

    def add(self, watch: WatchState) -> bool:
        """False when the key was tracked already."""
        key = watch.key
        if key in self._watches:
            return False
        self._watches[key] = watch
        self._by_hash[key_hash(key)] = key
        self._by_bucket.setdefault(self._layout.bucket_of(key), set()).add(key)
        return True

    def remove(self, key: WatchKey) -> bool:
        """False when the key was not tracked."""
        if self._watches.pop(key, None) is None:
            return False
        self._by_hash.pop(key_hash(key), None)
        bucket = self._layout.bucket_of(key)
        same_bucket = self._by_bucket.get(bucket)
        if same_bucket is not None:
            same_bucket.discard(key)
            if not same_bucket:
                del self._by_bucket[bucket]
        return True

    def __contains__(self, key: WatchKey) -> bool:
        return key in self._watches

    def __iter__(self) -> Iterator[WatchKey]:
        return iter(self._watches)

    def get(self, key: WatchKey) -> WatchState | None:
        return self._watches.get(key)

    def still(self, key: WatchKey, watch: WatchState | None) -> bool:
        """The key is still watched by `watch`: not given up meanwhile (across an await), nor given up and watched
        again (a key watched again starts afresh: its first interest write learns where the cluster is)."""
        return watch is not None and self._watches.get(key) is watch

    def by_hash(self, hashed: str) -> WatchKey | None:
        return self._by_hash.get(hashed)

    def in_bucket(self, bucket: int) -> frozenset[WatchKey]:
        return frozenset(self._by_bucket.get(bucket, ()))
