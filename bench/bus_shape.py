"""The shape of the Redis bus, read from the source: what each class holds and who reaches into whom.

    python -m bench.bus_shape                 # this checkout
    python -m bench.bus_shape /path/to/sidecar

Prints, for each class under `sidecar/bus/`: its base classes in `sidecar/bus/`, the attributes it holds
(assigned as `self.<name>` in its own body or in a base's), and those of them read from another file (as
`self.<name>` in a subclass defined elsewhere, or as `<obj>._<name>` anywhere outside its file). Then, over all
of `sidecar/`: every import of another module's underscore name, and the largest modules.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.repo.test_import_graph import underscore_imports

SIDECAR = Path(__file__).resolve().parents[1] / "sidecar"


@dataclass
class ClassShape:
    name: str
    path: Path
    bases: list[str]
    own: set[str] = field(default_factory=set)
    reads: set[str] = field(default_factory=set)
    """`self.<name>` read or written anywhere in the class's body."""


def _classes(bus: Path) -> dict[str, ClassShape]:
    found: dict[str, ClassShape] = {}
    for path in sorted(bus.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.ClassDef):
                continue
            shape = ClassShape(node.name, path, [ast.unparse(base) for base in node.bases])
            for inner in ast.walk(node):
                if isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name) and inner.value.id == "self":
                    shape.reads.add(inner.attr)
                    if isinstance(inner.ctx, ast.Store):
                        shape.own.add(inner.attr)
                if isinstance(inner, ast.AnnAssign) and isinstance(inner.target, ast.Name) and inner in node.body:
                    shape.own.add(inner.target.id)  # a dataclass field
            found[node.name] = shape
    return found


def _held(name: str, classes: dict[str, ClassShape]) -> set[str]:
    shape = classes[name]
    held = set(shape.own)
    for base in shape.bases:
        if base in classes:
            held |= _held(base, classes)
    return held


def _reads_elsewhere(sidecar: Path, *, private: bool) -> dict[Path, set[str]]:
    """Per file, the `<obj>.<name>` attributes it reads (underscore names, or the others) where <obj> is not
    `self` (or `cls`)."""
    reads: dict[Path, set[str]] = {}
    for path in sidecar.rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Attribute) or node.attr.startswith("__"):
                continue
            if node.attr.startswith("_") != private:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            names.add(node.attr)
        reads[path] = names
    return reads


def bus_classes(sidecar: Path) -> list[tuple[str, str, list[str], list[str], list[str], list[str]]]:
    """(class, file, bases in bus/, attributes held, attributes held that another file reads, public attributes
    whose name another bus file reads off an object: its read-only interface, matched by name alone)."""
    classes = _classes(sidecar / "bus")
    private_reads = _reads_elsewhere(sidecar, private=True)
    public_reads = _reads_elsewhere(sidecar / "bus", private=False)
    rows = []
    for name, shape in classes.items():
        held = _held(name, classes)
        elsewhere: set[str] = set()
        for other in classes.values():
            if other.path != shape.path and name in _ancestors(other.name, classes):
                elsewhere |= held & other.reads  # a subclass in another file uses what this class holds
        for path, names in private_reads.items():
            if path != shape.path:
                elsewhere |= {attr for attr in shape.own if attr.startswith("_")} & names
        public = {attr for attr in shape.own if not attr.startswith("_")}
        interface = {attr for path, names in public_reads.items() if path != shape.path for attr in public & names}
        bases = [base for base in shape.bases if base in classes]
        rows.append((name, shape.path.name, bases, sorted(held), sorted(elsewhere), sorted(interface)))
    return rows


def _ancestors(name: str, classes: dict[str, ClassShape]) -> set[str]:
    found: set[str] = set()
    for base in classes[name].bases:
        if base in classes:
            found |= {base, *_ancestors(base, classes)}
    return found


def main(argv: list[str]) -> None:
    sidecar = Path(argv[0]).resolve() if argv else SIDECAR
    print(f"bus classes under {sidecar / 'bus'}:")
    for name, file, bases, held, elsewhere, interface in bus_classes(sidecar):
        base = f"({', '.join(bases)})" if bases else ""
        print(f"  {file}: {name}{base}: {len(held)} attributes, {len(elsewhere)} read from another file")
        if elsewhere:
            print(f"      read elsewhere: {', '.join(elsewhere)}")
        if interface:
            print(f"      public, read by name elsewhere in bus/: {', '.join(interface)}")
    imports = underscore_imports(sidecar)
    print(f"cross-module underscore imports over sidecar/: {len(imports)}")
    for line in imports:
        print(f"  {line}")
    sizes = sorted(((len(p.read_text().splitlines()), p) for p in sidecar.rglob("*.py")), reverse=True)
    bus_sizes = [(n, p) for n, p in sizes if p.parent.name == "bus"]
    print("largest modules: " + ", ".join(f"{p.relative_to(sidecar.parent)} {n}" for n, p in sizes[:3]))
    print("largest bus modules: " + ", ".join(f"{p.name} {n}" for n, p in bus_sizes[:3]))


if __name__ == "__main__":
    main(sys.argv[1:])
