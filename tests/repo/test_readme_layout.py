"""The README's layout paragraph names every package of `sidecar/` and every folder of tests, and nothing that is
not there; and every link within the page (its contents, its cross-references) leads to a heading."""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
_NAMED = re.compile(r"`((?:sidecar|tests)/[\w/]+?)/?`")
_LINK = re.compile(r"\]\(#([\w-]+)\)")
_HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)


def _paragraph() -> str:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("\nLayout: ")
    return text[start : text.index("\n\n", start + 1)]


def _folders() -> set[str]:
    inits = (REPO_ROOT / "sidecar").rglob("__init__.py")
    packages = {str(init.parent.relative_to(REPO_ROOT)) for init in inits} - {"sidecar"}
    tests = {
        str(folder.relative_to(REPO_ROOT))
        for folder in (REPO_ROOT / "tests").iterdir()
        if folder.is_dir() and not folder.name.startswith((".", "_"))
    }
    return packages | tests


def test_the_layout_paragraph_names_every_package_and_test_folder() -> None:
    assert sorted(_folders() - set(_NAMED.findall(_paragraph()))) == []


def test_every_path_the_layout_paragraph_names_exists() -> None:
    assert sorted(name for name in _NAMED.findall(_paragraph()) if not (REPO_ROOT / name).exists()) == []


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lowercase, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_within_the_readme_leads_to_a_heading() -> None:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)  # a `# comment` in a block is no heading
    headings = {_anchor(heading) for heading in _HEADING.findall(prose)}
    assert sorted(set(_LINK.findall(text)) - headings) == []
