"""Listeners that register themselves and are handed a remover each (an upstream's notifications, its recovery)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["Listeners"]

L = TypeVar("L", bound=Callable[..., None])


class Listeners(Generic[L]):
    """The listeners held now; each `add` returns an idempotent remover."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[object, L] = {}

    def add(self, listener: L) -> Callable[[], None]:
        token = object()  # the same function may be added twice, and removed once per adding
        self._held[token] = listener

        def remove() -> None:
            self._held.pop(token, None)

        return remove

    def __iter__(self) -> Iterator[L]:
        """Those held as the telling starts: a listener told may add or remove listeners."""
        return iter(list(self._held.values()))
