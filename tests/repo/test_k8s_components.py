"""The kustomize components render (with the real `kubectl kustomize`) into manifests that agree with the
sidecar: monitors scrape the admin port the configuration serves and select the pods' labels, the rule holds
the alerts file's rules, probes ask the MCP listener (over HTTPS with the tls component), the replicas' Redis
URL comes from a Secret and their instance names from the pods' names, and their disruption budget and spread
select the pods. Every combination of components renders into documents the Kubernetes API's schemas accept
(`kubernetes-validate`, strict: an unknown field is an error), and the Prometheus Operator's kinds their CRDs'
schemas (tests/repo/operator_schemas.py), with no volume mounted inside another.

    python3 -m tests.repo.test_k8s_components    # rewrites prometheusrule.yaml from config/prometheus/alerts.yml
"""

from __future__ import annotations

import functools
import itertools
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import trustme
import yaml
from kubernetes_validate.utils import all_versions

from sidecar.config import SidecarConfig, load_config
from sidecar.observability.logs import INSTANCE_ENV
from tests.prereqs import require_binary
from tests.repo.operator_schemas import validator

CONFIG = Path(__file__).resolve().parents[2] / "config"
K8S = CONFIG / "k8s"
COMPONENTS = K8S / "components"
RULE = COMPONENTS / "monitoring" / "prometheusrule.yaml"
_RULE_HEADER = (
    "# config/prometheus/alerts.yml as a PrometheusRule (tests/repo/test_k8s_components.py keeps the two the same;\n"
    "# regenerate with: python3 -m tests.repo.test_k8s_components).\n"
)

Manifests = dict[tuple[str, str], dict[str, Any]]
COMBINATIONS = [
    combination
    for size in range(len(list(COMPONENTS.iterdir())) + 1)
    for combination in itertools.combinations(sorted(path.name for path in COMPONENTS.iterdir() if path.is_dir()), size)
]
"""Every set of components an overlay can list, none and all included."""
KUBERNETES_VERSIONS = (all_versions()[0], all_versions()[-1])
"""The oldest and the newest Kubernetes whose API schemas kubernetes-validate ships."""


def prometheus_rule() -> str:
    """The PrometheusRule that carries config/prometheus/alerts.yml's groups."""
    groups = yaml.safe_load((CONFIG / "prometheus" / "alerts.yml").read_text(encoding="utf-8"))
    document = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "catalog-mcp-sidecar",
            "labels": {"app.kubernetes.io/name": "catalog-mcp", "app.kubernetes.io/component": "mcp-sidecar"},
        },
        "spec": groups,
    }
    return _RULE_HEADER + yaml.safe_dump(document, sort_keys=False, width=120)


def _render(*components: str) -> Manifests:
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in yaml.safe_load_all(_rendered(components)) if doc}


@functools.cache
def _rendered(components: tuple[str, ...]) -> str:
    kubectl = require_binary("kubectl", needed_by="the kustomize components' tests")
    with tempfile.TemporaryDirectory(dir=K8S.parent, prefix=".overlay-") as overlay:
        root = Path(overlay)
        kustomization = {
            "resources": ["../k8s"],
            "components": [f"../k8s/components/{name}" for name in components],
        }
        (root / "kustomization.yaml").write_text(yaml.safe_dump(kustomization), encoding="utf-8")
        rendered = subprocess.run([kubectl, "kustomize", str(root)], capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    return rendered.stdout


def _config(manifests: Manifests, tmp_path: Path, environ: dict[str, str] | None = None) -> SidecarConfig:
    (text,) = manifests[("ConfigMap", "catalog-mcp-sidecar")]["data"].values()
    path = tmp_path / "sidecar.yaml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, environ=environ or {})


def _pod(manifests: Manifests) -> dict[str, Any]:
    template: dict[str, Any] = manifests[("Deployment", "catalog-mcp")]["spec"]["template"]
    return template


def _sidecar(manifests: Manifests) -> dict[str, Any]:
    (container,) = [c for c in _pod(manifests)["spec"]["containers"] if c["name"] == "mcp-sidecar"]
    return container


def _port(container: dict[str, Any], name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return int(port)


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector["matchLabels"].items())


def test_the_prometheus_rule_holds_the_alert_files_rules() -> None:
    assert RULE.read_text(encoding="utf-8") == prometheus_rule()


def test_the_monitoring_component_scrapes_the_admin_port_and_ships_the_dashboard(tmp_path: Path) -> None:
    manifests = _render("monitoring")
    config = _config(manifests, tmp_path)
    pod = _pod(manifests)
    monitor = manifests[("PodMonitor", "catalog-mcp-sidecar")]["spec"]
    assert _selects(monitor["selector"], pod["metadata"]["labels"])
    (endpoint,) = monitor["podMetricsEndpoints"]
    assert _port(_sidecar(manifests), endpoint["port"]) == config.admin.port
    assert endpoint["path"] == config.metrics.path
    assert {"targetLabel": "job", "replacement": "mcp-sidecar"} in endpoint["relabelings"]
    dashboard = manifests[("ConfigMap", "mcp-sidecar-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = dashboard["data"].values()
    assert json.loads(text) == json.loads((CONFIG / "grafana" / "mcp-sidecar.json").read_text(encoding="utf-8"))
    rule = manifests[("PrometheusRule", "catalog-mcp-sidecar")]
    assert rule["spec"] == yaml.safe_load((CONFIG / "prometheus" / "alerts.yml").read_text(encoding="utf-8"))


def test_the_servicemonitor_component_finds_the_admin_port_through_a_service_of_its_own() -> None:
    manifests = _render("servicemonitor")
    pod = _pod(manifests)
    admin = manifests[("Service", "catalog-mcp-admin")]
    assert _selects({"matchLabels": admin["spec"]["selector"]}, pod["metadata"]["labels"])
    (port,) = admin["spec"]["ports"]
    assert port["targetPort"] == "admin" and _port(_sidecar(manifests), "admin") == port["port"]
    monitor = manifests[("ServiceMonitor", "catalog-mcp-sidecar")]["spec"]
    assert _selects(monitor["selector"], admin["metadata"]["labels"])
    clients = manifests[("Service", "catalog-mcp")]
    assert not _selects(monitor["selector"], clients["metadata"]["labels"]), (
        "metrics must not be on the clients' Service"
    )


def test_the_replicas_component_runs_several_on_redis_from_a_secret_spread_and_budgeted(tmp_path: Path) -> None:
    manifests = _render("replicas")
    deployment = manifests[("Deployment", "catalog-mcp")]
    assert deployment["spec"]["replicas"] > 1
    labels = _pod(manifests)["metadata"]["labels"]
    budget = manifests[("PodDisruptionBudget", "catalog-mcp")]["spec"]
    assert _selects(budget["selector"], labels) and budget["maxUnavailable"] == 1
    spread = _pod(manifests)["spec"]["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in spread} == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    assert all(_selects(c["labelSelector"], labels) for c in spread)
    env = {e["name"]: e for e in _sidecar(manifests)["env"]}
    assert env["MCP_SIDECAR__BUS__REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "catalog-mcp-redis",
        "key": "url",
    }
    # Each replica is named by its pod (logs' and metrics' instance), not by a random id of its own.
    assert env[INSTANCE_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    environ = {"MCP_SIDECAR__BUS__BACKEND": env["MCP_SIDECAR__BUS__BACKEND"]["value"]}
    environ["MCP_SIDECAR__BUS__REDIS_URL"] = "redis://:secret@redis:6379/0"  # what the Secret would hold
    config = _config(manifests, tmp_path, environ)
    assert config.bus.backend == "redis"


def test_the_tls_component_serves_https_from_a_secret_and_probes_ask_over_https(tmp_path: Path) -> None:
    manifests = _render("tls")
    sidecar = _sidecar(manifests)
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    tls = yaml.safe_load(env["MCP_SIDECAR__LISTEN__TLS"])
    (mount,) = [m for m in sidecar["volumeMounts"] if m["name"] == "sidecar-tls"]
    assert all(Path(tls[key]).parent == Path(mount["mountPath"]) for key in ("cert_file", "key_file"))
    (volume,) = [v for v in _pod(manifests)["spec"]["volumes"] if v["name"] == "sidecar-tls"]
    assert volume["secret"]["secretName"] == "catalog-mcp-tls"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        check = sidecar[probe]["httpGet"]
        assert check["scheme"] == "HTTPS" and check["port"] == "http", probe
    # The same settings with files that exist here load as a configuration (the keys and their shape are right).
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    leaf = trustme.CA().issue_cert("catalog-mcp")  # the configuration loads only a real certificate and its key
    leaf.private_key_and_cert_chain_pem.write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    override = {"MCP_SIDECAR__LISTEN__TLS": f"{{cert_file: {cert}, key_file: {key}}}"}
    assert _config(manifests, tmp_path, override).listen.tls.enabled
    assert _port(sidecar, "http") == _config(manifests, tmp_path, override).listen.port


def _problems(document: dict[str, Any]) -> list[str]:
    """What the API server would refuse in `document` (strict field validation), for each Kubernetes version."""
    if document["apiVersion"].startswith("monitoring.coreos.com/"):
        return [f"{error.json_path}: {error.message}" for error in validator(document["kind"]).iter_errors(document)]
    problems = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            problems.append(f"Kubernetes {version}: {error.json_path}: {error.message}")
    return problems


def test_every_combination_of_components_is_valid_against_the_schemas_of_the_api_and_the_operator() -> None:
    documents: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {}
    for combination in COMBINATIONS:
        for document in _render(*combination).values():
            documents.setdefault(json.dumps(document, sort_keys=True), (combination, document))  # each once
    kinds = {document["kind"] for _, document in documents.values()}
    assert {"Deployment", "PodMonitor", "ServiceMonitor", "PrometheusRule", "PodDisruptionBudget"} <= kinds
    problems = [
        f"{document['kind']} {document['metadata']['name']} (components {list(combination)}): {problem}"
        for combination, document in documents.values()
        for problem in _problems(document)
    ]
    assert problems == []


def test_the_schema_checks_refuse_a_misspelt_field() -> None:
    # The case a check that accepted anything would pass: one unknown field in a Deployment, one in a monitor.
    manifests = _render("servicemonitor")
    deployment = json.loads(json.dumps(manifests[("Deployment", "catalog-mcp")]))
    deployment["spec"]["replica"] = 2
    assert any("'replica' was unexpected" in problem for problem in _problems(deployment)), _problems(deployment)
    monitor = json.loads(json.dumps(manifests[("ServiceMonitor", "catalog-mcp-sidecar")]))
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    assert any("'intervall' was unexpected" in problem for problem in _problems(monitor)), _problems(monitor)


@pytest.mark.parametrize("combination", COMBINATIONS, ids=lambda names: "+".join(names) or "base")
def test_no_volume_is_mounted_inside_another(combination: tuple[str, ...]) -> None:
    # A Secret mounted inside the read-only ConfigMap volume is a nested mount some runtimes refuse or shadow.
    for container in _pod(_render(*combination))["spec"]["containers"]:
        paths = [Path(mount["mountPath"]) for mount in container.get("volumeMounts", [])]
        nested = [
            (outer, inner) for outer in paths for inner in paths if inner != outer and inner.is_relative_to(outer)
        ]
        assert nested == [], f"{container['name']}: {nested}"


if __name__ == "__main__":
    RULE.write_text(prometheus_rule(), encoding="utf-8")
    print(f"wrote {RULE}")
