"""The README's configuration table is the configuration model: every key of it, no key it lacks, and each
default the table writes is the model's."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr

from sidecar.config import SidecarConfig

README = Path(__file__).resolve().parents[2] / "README.md"
_ROW = re.compile(r"^\| `(\w+)` \| (.+) \|$")
_KEY = re.compile(r"`([a-z_]+(?:\.[a-z_]+)*)`( [^\s,;|()]+(?: MiB)?)?")
"""A key as the table writes it (lowercase, dotted below a nested section), and the default after it, if any."""


def _table() -> dict[str, str | None]:
    """Each key of the Configuration section's table (`section.key`) and the default written after it."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("\n## Configuration\n") :]
    section = section[: section.index("\n## ", 1)]
    keys: dict[str, str | None] = {}
    for line in section.splitlines():
        row = _ROW.match(line)
        if row is None:
            continue
        name, cell = row.groups()
        for key, default in _KEY.findall(cell):
            dotted = f"{name}.{key}"
            keys[dotted] = keys.get(dotted) or (default.strip() or None)
    return keys


def _leaves(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf key of `model` (`section.key`, `section.nested.key`) with its default."""
    for name, field in model.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield from _leaves(kind, f"{prefix}{name}.")
        elif prefix:  # a section's keys; the sections themselves are not keys
            default = field.get_default(call_default_factory=True)
            yield f"{prefix}{name}", default


def _expected(default: Any) -> str | float | None:
    """The model's default as the table must write it (a number as a number); None where the table need not
    write one."""
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, int | float):
        return float(default)
    if isinstance(default, SecretStr):
        return default.get_secret_value()
    if isinstance(default, str) and default:
        return default
    if isinstance(default, list | dict) and not default:
        return "[]" if isinstance(default, list) else "{}"
    return None  # None, an empty string, or a list the table says in words


def _read(written: str | None) -> str | float | None:
    """A default as the table writes it: `1 MiB` and `0.1` are numbers, anything else is text."""
    if written is None:
        return None
    number, _, unit = written.partition(" ")
    try:
        return float(number) * (1_048_576 if unit == "MiB" else 1)
    except ValueError:
        return written


def test_every_key_of_the_model_is_in_the_readme_table_and_no_other() -> None:
    documented = set(_table())
    model = {key for key, _ in _leaves(SidecarConfig)}
    assert sorted(model - documented) == [], "keys missing from the README's configuration table"
    assert sorted(documented - model) == [], "keys in the README's configuration table that the model lacks"


def test_each_default_the_readme_table_writes_is_the_models() -> None:
    table = _table()
    wrong = {}
    for key, default in _leaves(SidecarConfig):
        expected = _expected(default)
        if expected is not None and _read(table.get(key)) != expected:
            wrong[key] = (table.get(key), expected)
    assert wrong == {}, "README (written, model): " + repr(wrong)
