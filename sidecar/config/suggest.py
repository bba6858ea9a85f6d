""" "Did you mean": the known key an unknown one was most likely meant to be.

A misspelt key (`polling.default_intervl_ms`) is answered with the closest key at the same level; a key with no
close neighbour there but a namesake in another section (`min_interval_ms` at the top level, dedented out of
`polling`) is answered with that section's key, since a slip of indentation is the likelier mistake.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterator, Sequence

from pydantic import BaseModel

__all__ = ["suggestion"]

_CUTOFF = 0.75
"""How alike two names must be (difflib's ratio) to be offered: `intervl` for `interval_ms` is not, `intervl_ms` is."""


def _models_in(annotation: object) -> Iterator[type[BaseModel]]:
    """The section models a field's annotation holds: itself, a list's items, an Optional's value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    if typing.get_origin(annotation) in (list, typing.Union, types.UnionType):
        for argument in typing.get_args(annotation):
            yield from _models_in(argument)


def _model_at(root: type[BaseModel], path: Sequence[int | str]) -> type[BaseModel] | None:
    """The section model at `path` (list positions skipped), or None where the path leaves the models."""
    model = root
    for part in path:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        found = next(_models_in(field.annotation), None) if field is not None else None
        if found is None:
            return None
        model = found
    return model


def _every_key(model: type[BaseModel], prefix: str = "", depth: int = 3) -> Iterator[tuple[str, str]]:
    """(name, dotted path) of every key under `model`, sections within sections `depth` deep."""
    for name, field in model.model_fields.items():
        dotted = f"{prefix}.{name}" if prefix else name
        yield name, dotted
        if depth > 1:
            for inner in _models_in(field.annotation):
                yield from _every_key(inner, dotted, depth - 1)


def suggestion(root: type[BaseModel], loc: Sequence[int | str]) -> str:
    """`did you mean ...?` for the unknown key at `loc` (pydantic's error location), or "" when nothing is close."""
    if not loc or not isinstance(loc[-1], str):
        return ""
    unknown = loc[-1]
    parent = _model_at(root, loc[:-1])
    if parent is None:
        return ""
    close = difflib.get_close_matches(unknown, list(parent.model_fields), n=1, cutoff=_CUTOFF)
    if close:
        return f"did you mean {close[0]!r}?"
    here = ".".join(str(part) for part in loc[:-1] if isinstance(part, str))
    elsewhere = sorted(
        dotted for name, dotted in _every_key(root) if name == unknown and dotted.rpartition(".")[0] != here
    )
    if elsewhere:
        return f"did you mean {' or '.join(elsewhere[:2])}? (check the indentation)"
    return ""
