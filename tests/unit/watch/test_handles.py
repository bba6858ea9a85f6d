"""A stream's interest in a watch: released once, however often the stream lets go."""

from __future__ import annotations

from sidecar.changes import WatchKey
from sidecar.watch.handles import Handle


def test_a_handle_names_its_watch_and_context_and_is_released_once() -> None:
    released: list[Handle] = []
    key = WatchKey("resource", "x://1", "public")
    handle = Handle(key, "alice", released.append)
    assert (handle.key, handle.context) == (key, "alice")
    assert released == []
    handle.release()
    handle.release()
    assert released == [handle]
