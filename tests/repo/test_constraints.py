"""constraints.txt, the versions CI and the container image install, holds together with pyproject.toml: every
dependency and extra has a pin inside its range (`bash .ci/lock` writes them), and everything that installs the
project installs it through that file."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "constraints.txt"
PROJECT = "mcp-sidecar"


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        name, equals, version = line.partition("==")
        assert equals and re.fullmatch(r"[a-z0-9-]+", name) and version.strip() == version, f"not name==version: {line}"
        assert name not in pins, f"{name} pinned twice"
        pins[name] = version
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    listed = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    return [Requirement(text) for text in listed]


def test_every_dependency_and_extra_has_a_pin_inside_its_range() -> None:
    pins = _pins()
    assert list(pins) == sorted(pins), "constraints.txt is sorted by name (bash .ci/lock writes it so)"
    problems = []
    for requirement in _requirements():
        name = canonicalize_name(requirement.name)
        if name == PROJECT or (requirement.marker is not None and not requirement.marker.evaluate()):
            continue  # an extra of the project itself; a dependency of another platform
        if name not in pins:
            problems.append(f"{requirement}: no pin")
        elif not requirement.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{requirement}: pinned at {pins[name]}")
    assert problems == [], f"run `bash .ci/lock`: {problems}"


def test_ci_and_the_image_install_the_project_through_the_constraints() -> None:
    installs = []
    for path in [ROOT / "Dockerfile", *(ROOT / ".ci").glob("*")]:
        text = path.read_text(encoding="utf-8").replace("\\\n", " ")
        for line in text.splitlines():
            command = line.split("#")[0] if path.name != "Dockerfile" else line
            if "pip install" in command and not line.lstrip().startswith("#") and "--dry-run" not in command:
                installs.append((path.name, command.strip()))
    project_installs = [(name, cmd) for name, cmd in installs if re.search(r"""(\s|")\.(\[|"|\s|$)|-r """, cmd)]
    assert {name for name, _ in project_installs} >= {"Dockerfile", "setup", "run", "nightly"}, installs
    unconstrained = [(name, cmd) for name, cmd in project_installs if "-c constraints.txt" not in cmd]
    assert unconstrained == []
