"""The README's metrics table is what `/metrics` serves: every family, its type and its labels, nothing more."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from sidecar.observability.metrics import Metrics

README = Path(__file__).resolve().parents[2] / "README.md"
_ROW = re.compile(r"^\| `(mcp_sidecar_\w+)` \| (\w+) \| ([\w, ]*) \| .+ \|$")


def _documented() -> dict[str, tuple[str, frozenset[str]]]:
    rows = {}
    for line in README.read_text(encoding="utf-8").splitlines():
        found = _ROW.match(line)
        if found is not None:
            name, kind, labels = found.groups()
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
