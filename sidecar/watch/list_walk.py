"""A look at a list, page by page, with no I/O: which request to send next, and what the pages add up to.

`observe` sends each request this walk asks for and hands back the answer or the error; the walk decides whether
another page is due (a `nextCursor` that is a string), whether an error ends the look (all but an upstream
without templates), and what the look saw: every item of every page in order, the shortest ttl of any page, and
public only when every page was.
"""

from __future__ import annotations

from typing import Any

from sidecar.changes import WatchKind
from sidecar.protocol.errors import UpstreamRpcError
from sidecar.protocol.lists import LIST_KINDS
from sidecar.protocol.types import JsonObject
from sidecar.watch.fingerprint import fingerprint_items
from sidecar.watch.observation import Observation, ttl_hint

__all__ = ["MAX_LIST_PAGES", "ListWalk"]

MAX_LIST_PAGES = 100
"""A list longer than this many pages is treated as an upstream fault (a cursor that never ends)."""

_TEMPLATES = "resources/templates/list"
_METHOD_NOT_FOUND = -32601


class ListWalk:
    """Every page of each method a list kind walks, in order, and what they add up to."""

    def __init__(self, kind: WatchKind) -> None:
        self._methods = LIST_KINDS[kind].methods
        self._at = 0
        """The method being walked (its index); past the last, the walk is over."""
        self._cursor: str | None = None
        self._pages = 0
        """Pages of the current method read so far."""
        self._items: list[tuple[str, Any]] = []
        self._ttls: list[int] = []
        self.public = True
        """Whether every page read so far was public."""

    def next_request(self) -> tuple[str, JsonObject] | None:
        """The method and params to ask next; None once every page of every method has been read."""
        if self._at == len(self._methods):
            return None
        method = self._methods[self._at].method
        return method, {} if self._cursor is None else {"cursor": self._cursor}

    def answered(self, result: JsonObject) -> None:
        """The page asked for came back as `result`. Raises ValueError (a bad answer) when it points to a page past
        the last this walk reads of its method."""
        method, field = self._methods[self._at]
        self._pages += 1
        page = result.get(field)
        self._items.extend((method, item) for item in (page if isinstance(page, list) else []))
        ttl = ttl_hint(result)
        if ttl is not None:
            self._ttls.append(ttl)
        self.public = self.public and result.get("cacheScope") == "public"
        next_cursor = result.get("nextCursor")
        if not isinstance(next_cursor, str):
            self._next_method()
        elif self._pages == MAX_LIST_PAGES:
            raise ValueError(f"{method} has more than {MAX_LIST_PAGES} pages")
        else:
            self._cursor = next_cursor

    def failed(self, error: UpstreamRpcError) -> bool:
        """The page asked for was answered with `error`: True when the walk goes on without that method (an
        upstream without templates), False when the error is the look's."""
        if self._methods[self._at].method == _TEMPLATES and error.code == _METHOD_NOT_FOUND:
            self._next_method()
            return True
        return False

    def observation(self) -> Observation:
        """What the pages read add up to; raises ValueError when their items cannot be fingerprinted."""
        return Observation(fingerprint_items(self._items), min(self._ttls) if self._ttls else None, self.public)

    def entries(self) -> list[Any]:
        """Every item of every page, in order, without the method it came from."""
        return [item for _, item in self._items]

    def _next_method(self) -> None:
        self._at += 1
        self._cursor = None
        self._pages = 0
