"""The README's metrics table is what `/metrics` serves: every family, its type, its labels and its help text,
nothing more; and the help texts speak an operator's words, not the engine's."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from sidecar.observability.metrics import Metrics

README = Path(__file__).resolve().parents[2] / "README.md"
_ROW = re.compile(r"^\| `(mcp_sidecar_\w+)` \| (\w+) \| ([\w, ]*) \| (.+) \|$")
_INTERNAL_WORDS = re.compile(
    r"\b(downstream|signals?|keys?|leases?|buckets?|hint(s|ed)?|interest|partitions?|app|singleflight|coalesced?)\b",
    re.IGNORECASE,
)
"""Words of the code, not of an operator: a help text says what they mean instead."""


def _documented() -> dict[str, tuple[str, frozenset[str]]]:
    rows = {}
    for line in README.read_text(encoding="utf-8").splitlines():
        found = _ROW.match(line)
        if found is not None:
            name, kind, labels, _ = found.groups()
            rows[name] = (kind, frozenset(label.strip() for label in labels.split(",") if label.strip()))
    return rows


def _served() -> dict[str, tuple[str, frozenset[str]]]:
    metrics = Metrics()
    # Every labelled family's children exist once they are used; the table names the labels, not the values.
    served = {}
    for family in text_string_to_metric_families(metrics.render()[0].decode()):
        name = family.name + ("_total" if family.type == "counter" else "")
        served[name] = (family.type, frozenset())
    for metric in metrics.registry._collector_to_names:  # the registered collectors, with their label names
        labels = frozenset(getattr(metric, "_labelnames", ()))
        name = getattr(metric, "_name", None)
        if name is None:
            continue
        full = name + ("_total" if getattr(metric, "_type", "") == "counter" else "")
        if full in served:
            served[full] = (served[full][0], labels)
    return served


def test_the_readme_table_lists_every_family_served_with_its_type_and_labels() -> None:
    assert _documented() == _served()


def test_no_created_series_is_served() -> None:
    assert "_created" not in Metrics().render()[0].decode()


def _help_texts() -> dict[str, str]:
    texts = {}
    for metric in Metrics().registry._collector_to_names:
        name = metric._name + ("_total" if metric._type == "counter" else "")  # type: ignore[attr-defined]
        texts[name] = metric._documentation  # type: ignore[attr-defined]
    return texts


def test_the_readme_table_says_what_each_help_text_says() -> None:
    described = {}
    for line in README.read_text(encoding="utf-8").splitlines():
        found = _ROW.match(line)
        if found is not None:
            described[found.group(1)] = found.group(4)
    # The table may add a note after the help text (a former name), never say something else.
    differing = {name: text for name, text in _help_texts().items() if not described.get(name, "").startswith(text)}
    assert differing == {}, "help texts the README's table does not repeat"


def test_help_texts_use_no_internal_words() -> None:
    internal = {name: text for name, text in _help_texts().items() if _INTERNAL_WORDS.search(text)}
    assert internal == {}
