"""Hints from the source of truth (`POST /hints`): which watches a hint names, and its form on the bus.

A hint names resource URIs, exactly or by glob (`*` matches any run of characters, `catalog://plans/*`), and
list kinds. It makes each matching watch, in every authorization context, look at the upstream soon with that
context's own credential, exactly as a write through the sidecar does: a hint, never a change (only the look
decides whether anyone is told).

Other replicas hear it on the bus's revalidate path, as one entry of the contexts it carries: an entry that can
never name a context (contexts are `public`, `anon` or `ctx-<hex>`), so a replica that does not know it hints
no private watch for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import orjson

from sidecar.protocol import LIST_KIND_OF_PRIMITIVE, ListPrimitive
from sidecar.watch.engine.index import Target

__all__ = ["LIST_NAMES", "ListName", "SourceHint", "UriGlob", "from_bus", "targets"]

ListName = ListPrimitive
LIST_NAMES = LIST_KIND_OF_PRIMITIVE
"""A hint names a list by its primitive (`tools`), as the command line does."""
_BUS_PREFIX = "source-hint:"


class UriGlob:
    """An exact URI, or a glob whose `*` matches any run of characters (none included); nothing else is special.

    Matched without regular expressions: the literal parts must appear in order, the first at the start and the
    last at the end, each found leftmost, which is linear in the URI and cannot backtrack however many `*`."""

    __slots__ = ("_parts", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._parts = text.split("*")

    @property
    def exact(self) -> bool:
        return len(self._parts) == 1

    def matches(self, uri: str) -> bool:
        parts = self._parts
        if len(parts) == 1:
            return uri == parts[0]
        first, last = parts[0], parts[-1]
        if len(uri) < len(first) + len(last) or not uri.startswith(first) or not uri.endswith(last):
            return False
        position, end = len(first), len(uri) - len(last)
        for middle in parts[1:-1]:
            found = uri.find(middle, position, end)
            if found < 0:
                return False
            position = found + len(middle)
        return True


@dataclass(frozen=True, slots=True)
class SourceHint:
    """What one `POST /hints` names: URIs or globs of resources, and list kinds."""

    uris: tuple[str, ...] = ()
    lists: tuple[ListName, ...] = ()

    def to_bus(self) -> str:
        return _BUS_PREFIX + orjson.dumps({"u": list(self.uris), "l": list(self.lists)}).decode()


def from_bus(contexts: Iterable[str]) -> tuple[frozenset[str], list[SourceHint]]:
    """Split what a revalidate announcement carries into the contexts that wrote and the source hints."""
    written: set[str] = set()
    hints = []
    for entry in contexts:
        if not entry.startswith(_BUS_PREFIX):
            written.add(entry)
            continue
        try:
            data = orjson.loads(entry[len(_BUS_PREFIX) :])
            uris = tuple(str(uri) for uri in data["u"])
            lists = tuple(name for name in data["l"] if name in LIST_NAMES)
        except (ValueError, KeyError, TypeError):
            continue  # not one we wrote
        hints.append(SourceHint(uris, lists))
    return frozenset(written), hints


def targets(hint: SourceHint, watched_uris: Iterable[str]) -> list[Target]:
    """What `hint` names, in every context: its URIs, the watched resource URIs its globs match (each URI once,
    however many contexts watch it), and the lists it names."""
    named: list[Target] = [("resource", uri) for uri in hint.uris if "*" not in uri]
    globs = [UriGlob(uri) for uri in hint.uris if "*" in uri]
    if globs:
        named.extend(("resource", uri) for uri in watched_uris if any(glob.matches(uri) for glob in globs))
    named.extend((LIST_NAMES[name], None) for name in hint.lists)
    return named
