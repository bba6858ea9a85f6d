"""The house's arrows run one way: no two parts of `sidecar/` import each other, directly or round a circle.

A part is a subpackage (`sidecar/watch/`) or a top-level module (`sidecar/changes.py`); imports are read
from the source (also those under TYPE_CHECKING: a type-only arrow against the flow is still one).
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

SIDECAR = Path(__file__).resolve().parents[2] / "sidecar"


def _part(module: str) -> str | None:
    names = module.split(".")
    return names[1] if len(names) > 1 and names[0] == "sidecar" else None


def _arrows() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in SIDECAR.rglob("*.py"):
        relative = path.relative_to(SIDECAR)
        part = relative.parts[0].removesuffix(".py")
        if part == "__init__":
            continue  # the package's face: its version only
        targets = graph.setdefault(part, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported = [node.module]
            elif isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            else:
                continue
            for module in imported:
                target = _part(module)
                if target is not None and target != part:
                    targets.add(target)
    return graph


def test_no_two_parts_of_the_sidecar_import_each_other() -> None:
    graph = _arrows()
    pairs = sorted((a, b) for a, targets in graph.items() for b in targets if a < b and a in graph.get(b, set()))
    assert pairs == [], f"parts importing each other: {pairs}"
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        raise AssertionError(f"an import circle: {exc.args[1]}") from None
    assert order.index("protocol") < order.index("upstream") < order.index("watch") < order.index("downstream")


def test_observability_reaches_up_into_nothing_it_reports_on() -> None:
    # `masking` is a leaf (it imports nothing of the sidecar): the one rule every surface, the log among them, uses.
    assert _arrows()["observability"] <= {"protocol", "changes", "identity", "config", "masking"}


def _imports_of(folder: Path) -> set[str]:
    found: set[str] = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
    return found


def test_the_http_and_stdio_legs_share_only_what_upstream_itself_holds() -> None:
    # Each leg is one way to reach the upstream behind the one `Upstream` interface; what both need (the era
    # rules, SSE, answers) lives in `sidecar/upstream/` itself, so neither leg reaches into the other.
    upstream = SIDECAR / "upstream"
    http, stdio = _imports_of(upstream / "http"), _imports_of(upstream / "stdio")
    assert not {m for m in http if m.startswith("sidecar.upstream.stdio")}, "upstream/http imports the stdio leg"
    assert not {m for m in stdio if m.startswith("sidecar.upstream.http")}, "upstream/stdio imports the http leg"


def underscore_imports(sidecar: Path = SIDECAR) -> list[str]:
    """`from sidecar.x import _name`, and `module._name` of a module of ours imported by name, anywhere in
    `sidecar` (this checkout's by default; `python -m bench.bus_shape` points it at another tree)."""
    found = []
    for path in sorted(sidecar.rglob("*.py")):
        where = path.relative_to(sidecar.parent)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and _part(node.module) is not None:
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{where}: from {node.module} import {alias.name}")
                    package = sidecar.parent.joinpath(*node.module.split("."))
                    if (package / f"{alias.name}.py").exists() or (package / alias.name / "__init__.py").exists():
                        modules.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                modules.update(alias.asname for alias in node.names if alias.asname and _part(alias.name))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                found.append(f"{where}: {node.value.id}.{node.attr}")
    return found


def test_no_module_reaches_for_another_modules_underscore_names() -> None:
    # An underscore name is its module's own: a second module that needs it gets a public name, or the code moves.
    assert underscore_imports() == []
