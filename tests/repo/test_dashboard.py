"""The Grafana dashboard and the alert rules query only metrics (and labels) the sidecar exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from sidecar.observability.metrics import Metrics

CONFIG = Path(__file__).resolve().parents[2] / "config"
DASHBOARD = CONFIG / "grafana" / "mcp-sidecar.json"
ALERTS = CONFIG / "prometheus" / "alerts.yml"

_METRIC = re.compile(r"\bmcp_sidecar_[a-z0-9_]+")
_SELECTOR = re.compile(r"\b(mcp_sidecar_[a-z0-9_]+)\{([^}]*)\}")
_MATCHER = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
TARGET_LABELS = {"job", "instance", "namespace", "pod"}
"""Labels Prometheus attaches to every scraped sample (see config/prometheus/)."""


def _exported() -> dict[str, set[str]]:
    """Every sample name the sidecar can expose, with the label names it carries."""
    names: dict[str, set[str]] = {}
    for metric in vars(Metrics()).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        family = metric._name  # what `describe()` reports, without the sample suffixes
        labels = set(metric._labelnames)
        kind = metric._type
        if kind == "counter":
            names[f"{family}_total"] = labels
        elif kind == "histogram":
            names[f"{family}_bucket"] = labels | {"le"}
            names[f"{family}_sum"] = labels
            names[f"{family}_count"] = labels
        else:
            names[family] = labels
    return names


def _build_info(names: dict[str, set[str]]) -> None:
    # Created inside Metrics() without an attribute: checked apart.
    names["mcp_sidecar_build_info"] = {"version", "python", "aiohttp"}


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # a collapsed row holds its panels


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def _dashboard_queries() -> list[str]:
    dashboard = _dashboard()
    queries = [target["expr"] for panel in _panels(dashboard["panels"]) for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            queries.append(variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"])
    return queries


def _alert_queries() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    names = _exported()
    _build_info(names)
    return names


def test_the_exported_names_follow_the_naming_rules(exported: dict[str, set[str]]) -> None:
    assert len(exported) > 40
    assert all(name.startswith("mcp_sidecar_") for name in exported)
    assert "mcp_sidecar_requests_total" in exported and "mcp_sidecar_change_delivery_seconds_bucket" in exported
    rendered = Metrics().render()[0].decode()
    for line in rendered.splitlines():
        if line.startswith("mcp_sidecar_") and "_created" not in line.split("{")[0]:
            assert line.split("{")[0].split(" ")[0] in exported, line


@pytest.mark.parametrize(
    "queries", [pytest.param(_dashboard_queries, id="dashboard"), pytest.param(_alert_queries, id="alerts")]
)
def test_every_metric_and_label_queried_is_exported(queries: Any, exported: dict[str, set[str]]) -> None:
    found = queries()
    assert found
    used = {name for query in found for name in _METRIC.findall(query)}
    assert used, "no mcp_sidecar_ metric in the queries"
    assert used <= set(exported), f"not exported: {sorted(used - set(exported))}"
    for query in found:
        selected = _SELECTOR.findall(query)
        in_query = set(TARGET_LABELS)
        for name, matchers in selected:
            labels = set(_MATCHER.findall(matchers)) - TARGET_LABELS
            assert labels <= exported[name], f"{name} has no label {sorted(labels - exported[name])}: {query}"
        for name in _METRIC.findall(query):
            in_query |= exported[name]
        for grouping in _GROUPING.findall(query):
            grouped = {label.strip() for label in grouping.split(",") if label.strip()}
            assert grouped <= in_query, f"grouping by {sorted(grouped - in_query)} that no metric has: {query}"


def test_the_dashboard_covers_the_families_operators_need() -> None:
    queried = {name for query in _dashboard_queries() for name in _METRIC.findall(query)}
    for needed in [
        "mcp_sidecar_requests_total",
        "mcp_sidecar_request_duration_seconds_bucket",
        "mcp_sidecar_upstream_up",
        "mcp_sidecar_upstream_era_info",
        "mcp_sidecar_upstream_requests_total",
        "mcp_sidecar_upstream_request_duration_seconds_bucket",
        "mcp_sidecar_listen_streams",
        "mcp_sidecar_watches",
        "mcp_sidecar_polls_total",
        "mcp_sidecar_changes_total",
        "mcp_sidecar_change_delivery_seconds_bucket",
        "mcp_sidecar_cache_hits_total",
        "mcp_sidecar_cache_misses_total",
        "mcp_sidecar_limit_rejections_total",
    ]:
        assert needed in queried, needed


def test_the_dashboard_is_well_formed() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] == "mcp-sidecar" and dashboard["title"]
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert set(variables) == {"datasource", "job", "instance"}
    panels = list(_panels(dashboard["panels"]))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[x, y]!r}"
                cells[x, y] = panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            # Every query follows the job and instance pickers.
            for name, matchers in _SELECTOR.findall(target["expr"]):
                assert 'job=~"$job"' in matchers and 'instance=~"$instance"' in matchers, (panel["title"], name)
