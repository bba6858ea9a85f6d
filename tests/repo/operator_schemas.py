"""The Prometheus Operator's kinds the kustomize components render (PodMonitor, ServiceMonitor, PrometheusRule), and
the schemas their CRDs declare, vendored in tests/repo/schemas/prometheus-operator.json (descriptions left out; the
CRDs are Apache-2.0, from github.com/prometheus-operator/prometheus-operator, example/prometheus-operator-crd).

    python3 -m tests.repo.operator_schemas CRD_DIR VERSION   # rewrites the JSON from a release's CRD files

`validator(kind)` checks a document strictly, as the API server does with strict field validation: a field the
schema does not declare is an error (the server would otherwise prune it without a word).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
import yaml

__all__ = ["KINDS", "SCHEMAS", "validator"]

SCHEMAS = Path(__file__).resolve().parent / "schemas" / "prometheus-operator.json"
KINDS = {"PodMonitor": "podmonitors", "ServiceMonitor": "servicemonitors", "PrometheusRule": "prometheusrules"}
"""Each kind, and the plural its CRD file is named by (monitoring.coreos.com_<plural>.yaml)."""
_GO_FLAG = "(?i)"
_SCHEMA_MAPS = ("properties", "patternProperties")
"""Keys whose values map names to schemas: a name there may be `description` without being one."""


def _without_descriptions(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_without_descriptions(each) for each in schema]
    if not isinstance(schema, dict):
        return schema
    kept: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "description":
            continue
        if key in _SCHEMA_MAPS:
            kept[key] = {name: _without_descriptions(each) for name, each in value.items()}
        else:
            kept[key] = _without_descriptions(value)
    return kept


def _strict(schema: Any) -> Any:
    """Every object schema that declares its properties and nothing else accepts no other field."""
    if isinstance(schema, list):
        return [_strict(each) for each in schema]
    if not isinstance(schema, dict):
        return schema
    strict = {
        key: ({name: _strict(each) for name, each in value.items()} if key in _SCHEMA_MAPS else _strict(value))
        for key, value in schema.items()
    }
    open_ended = "additionalProperties" in schema or schema.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in schema and not open_ended:
        strict["additionalProperties"] = False
    if isinstance(schema.get("pattern"), str) and _GO_FLAG in schema["pattern"]:
        # Go's regular expressions take a flag mid-pattern (`^(?i)(abort|warn)?$`); Python's re only at the front.
        strict["pattern"] = _GO_FLAG + schema["pattern"].replace(_GO_FLAG, "")
    return strict


def validator(kind: str) -> jsonschema.protocols.Validator:
    """A strict validator of one vendored kind's documents."""
    vendored = json.loads(SCHEMAS.read_text(encoding="utf-8"))
    schema = _strict(vendored["kinds"][kind]["schema"])
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    cls.check_schema(schema)
    checker: jsonschema.protocols.Validator = cls(schema)
    return checker


def vendor(crd_dir: Path, version: str) -> dict[str, Any]:
    """The served v1 schema of each kind, from a release's CRD files."""
    kinds: dict[str, Any] = {}
    for kind, plural in KINDS.items():
        crd = yaml.safe_load((crd_dir / f"monitoring.coreos.com_{plural}.yaml").read_text(encoding="utf-8"))
        assert crd["spec"]["names"]["kind"] == kind
        (served,) = [each for each in crd["spec"]["versions"] if each["name"] == "v1" and each["served"]]
        kinds[kind] = {
            "apiVersion": f"{crd['spec']['group']}/v1",
            "schema": _without_descriptions(served["schema"]["openAPIV3Schema"]),
        }
    return {
        "source": f"github.com/prometheus-operator/prometheus-operator v{version}, example/prometheus-operator-crd "
        "(Apache-2.0); descriptions left out",
        "version": version,
        "kinds": kinds,
    }


if __name__ == "__main__":
    crd_dir, version = Path(sys.argv[1]), sys.argv[2]
    vendored = json.dumps(vendor(crd_dir, version), separators=(",", ":"), sort_keys=True)
    SCHEMAS.write_text(vendored + "\n", encoding="utf-8")
    print(f"wrote {SCHEMAS}")
