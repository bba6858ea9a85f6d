"""Each module's `__all__` names exactly its public objects, sorted (httpx's exported-members test)."""

from __future__ import annotations

import importlib
import pkgutil
import types

import pytest

import sidecar


def _modules() -> list[str]:
    return sorted(info.name for info in pkgutil.walk_packages(sidecar.__path__, "sidecar."))


def _isort_style(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: CONSTANTS, then CamelCase classes, then everything else.
    kind = 0 if name.isupper() else 1 if name[:1].isupper() else 2
    return kind, name


@pytest.mark.parametrize("name", _modules())
def test_all_is_sorted_and_names_only_existing_public_objects(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    assert list(exported) in (sorted(exported, key=str.casefold), sorted(exported), sorted(exported, key=_isort_style))
    for item in exported:
        assert not item.startswith("_"), f"{name}.__all__ exports private {item}"
        assert hasattr(module, item), f"{name}.__all__ names missing {item}"
    public = {
        key
        for key, value in vars(module).items()
        if not key.startswith("_")
        and not isinstance(value, types.ModuleType)
        and getattr(value, "__module__", name) == name
        and callable(value)
    }
    assert public <= set(exported), f"{name}: public but not exported: {sorted(public - set(exported))}"
