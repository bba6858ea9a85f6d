"""The deployment examples agree with the sidecar: the Kubernetes ConfigMap is a valid configuration, and the
Deployment, Service, probes and scrape annotations point at what that configuration serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.config import SidecarConfig, load_config
from sidecar.downstream.guards import is_loopback

CONFIG = Path(__file__).resolve().parents[2] / "config"
K8S = CONFIG / "k8s"


def _manifests() -> dict[str, dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    found: dict[str, dict[str, Any]] = {}
    for name in kustomization["resources"]:
        for document in yaml.safe_load_all((K8S / name).read_text(encoding="utf-8")):
            assert document["kind"] not in found, f"two {document['kind']}s"
            found[document["kind"]] = document
    return found


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict[str, Any]]:
    return _manifests()


@pytest.fixture(scope="module")
def sidecar_config(manifests: dict[str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> SidecarConfig:
    (text,) = manifests["ConfigMap"]["data"].values()
    path = tmp_path_factory.mktemp("k8s") / "sidecar.yaml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, environ={})  # raises ConfigError naming any bad key


def _containers(manifests: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    pod = manifests["Deployment"]["spec"]["template"]["spec"]
    return {container["name"]: container for container in pod["containers"]}


def _port(container: dict[str, Any], name: str) -> int:
    (port,) = [port["containerPort"] for port in container["ports"] if port["name"] == name]
    assert isinstance(port, int)
    return port


def test_kustomization_lists_every_manifest(manifests: dict[str, dict[str, Any]]) -> None:
    assert set(manifests) == {"ConfigMap", "Deployment", "Service"}
    assert {path.name for path in K8S.glob("*.yaml")} == {
        "kustomization.yaml",
        "configmap.yaml",
        "deployment.yaml",
        "service.yaml",
    }


def test_the_sidecar_reads_the_configmap_and_serves_on_the_declared_port(
    manifests: dict[str, dict[str, Any]], sidecar_config: SidecarConfig
) -> None:
    containers = _containers(manifests)
    assert set(containers) == {"mcp-sidecar", "legacy-server"}
    sidecar = containers["mcp-sidecar"]
    pod = manifests["Deployment"]["spec"]["template"]["spec"]

    # The ConfigMap is mounted where --config looks for it.
    args = sidecar["args"]
    config_file = Path(args[args.index("--config") + 1])
    (mount,) = sidecar["volumeMounts"]
    assert config_file.parent == Path(mount["mountPath"])
    (volume,) = [volume for volume in pod["volumes"] if volume["name"] == mount["name"]]
    assert volume["configMap"]["name"] == manifests["ConfigMap"]["metadata"]["name"]
    assert config_file.name in manifests["ConfigMap"]["data"]

    # Reached from other pods: bound beyond loopback, on the port the probes, the Service and Prometheus use.
    assert not is_loopback(sidecar_config.listen.host)
    port = _port(sidecar, "http")
    assert port == sidecar_config.listen.port
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    annotations = manifests["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(_port(sidecar, "admin")) == str(sidecar_config.admin.port)
    assert sidecar_config.admin.host == "0.0.0.0"  # the scraper is another pod
    assert annotations["prometheus.io/path"] == sidecar_config.metrics.path

    # The upstream is the legacy server in the same pod, on its loopback.
    legacy_port = _port(containers["legacy-server"], "upstream")
    assert sidecar_config.upstream.url == f"http://127.0.0.1:{legacy_port}/mcp"


def test_shutdown_fits_in_the_grace_period(manifests: dict[str, dict[str, Any]], sidecar_config: SidecarConfig) -> None:
    pod = manifests["Deployment"]["spec"]["template"]["spec"]
    sidecar = _containers(manifests)["mcp-sidecar"]
    command = sidecar["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    # preStop pause, then SIGTERM: streams end and requests drain within shutdown_grace_s, before SIGKILL.
    assert float(command[1]) + sidecar_config.listen.shutdown_grace_s < pod["terminationGracePeriodSeconds"]


def test_the_service_exposes_only_the_sidecar(manifests: dict[str, dict[str, Any]]) -> None:
    service = manifests["Service"]["spec"]
    pod_labels = manifests["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= pod_labels.items()
    assert manifests["Deployment"]["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (port,) = service["ports"]
    assert port["targetPort"] == "http"


def test_kubernetes_scrape_config_keeps_these_pods(manifests: dict[str, dict[str, Any]]) -> None:
    scrape = yaml.safe_load((CONFIG / "prometheus" / "scrape-kubernetes.yml").read_text(encoding="utf-8"))
    (job,) = scrape["scrape_configs"]
    pod_labels = manifests["Deployment"]["spec"]["template"]["metadata"]["labels"]
    keeps = {
        tuple(rule["source_labels"]): rule["regex"] for rule in job["relabel_configs"] if rule.get("action") == "keep"
    }
    assert (
        keeps[("__meta_kubernetes_pod_label_app_kubernetes_io_component",)] == pod_labels["app.kubernetes.io/component"]
    )
    assert keeps[("__meta_kubernetes_pod_annotation_prometheus_io_scrape",)] == "true"
    renamed = [rule for rule in job["relabel_configs"] if rule.get("target_label") == "job"]
    assert renamed == [{"target_label": "job", "replacement": "mcp-sidecar"}]
    assert scrape["rule_files"] == ["alerts.yml"]
