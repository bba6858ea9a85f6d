"""Each module's `__all__` names exactly its public objects, sorted (httpx's exported-members test).

Every directory of the package is a real package (an `__init__.py` with its own `__all__`), so the walk below
sees every module: a directory without one would be skipped silently.
"""

from __future__ import annotations

import importlib
import pkgutil
import types
from pathlib import Path

import pytest

import sidecar

PACKAGE_ROOT = Path(sidecar.__file__).parent


def _modules() -> list[str]:
    return ["sidecar", *sorted(info.name for info in pkgutil.walk_packages(sidecar.__path__, "sidecar."))]


def test_every_directory_with_python_modules_is_a_package_the_walk_sees() -> None:
    directories = {path.parent for path in PACKAGE_ROOT.rglob("*.py") if "__pycache__" not in path.parts}
    not_packages = sorted(
        str(d.relative_to(PACKAGE_ROOT.parent)) for d in directories if not (d / "__init__.py").exists()
    )
    assert not_packages == [], f"directories without __init__.py (the walk skips them): {not_packages}"
    walked = set(_modules())
    for directory in directories:
        name = ".".join(directory.relative_to(PACKAGE_ROOT.parent).parts)
        assert name in walked, f"{name} is not walked"


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
        dunder = item.startswith("__") and item.endswith("__")  # `__version__` is public by convention
        assert dunder or not item.startswith("_"), f"{name}.__all__ exports private {item}"
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
