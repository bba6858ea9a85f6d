"""Configuration: the example file is complete and current, errors name the key, env overrides, hidden secrets."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from sidecar.config import ConfigError, SidecarConfig, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "sidecar.example.yaml"
SECTIONS = {name: field.annotation for name, field in SidecarConfig.model_fields.items()}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sidecar.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _error(path: Path | None = None, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, environ=environ or {})
    return str(info.value)


def test_the_example_file_loads_and_holds_every_default() -> None:
    assert load_config(EXAMPLE, environ={}) == SidecarConfig()


def test_the_example_file_has_exactly_the_models_sections() -> None:
    example = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    assert set(example) == set(SECTIONS)


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_the_example_file_has_exactly_the_keys_of_each_section(section: str) -> None:
    example = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    model = SECTIONS[section]
    assert isinstance(model, type) and issubclass(model, BaseModel)
    assert set(example[section]) == set(model.model_fields), f"config/sidecar.example.yaml [{section}] drifted"


def test_every_key_in_the_example_file_has_a_comment() -> None:
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    keyed = [line for line in lines if line.startswith("  ") and not line.lstrip().startswith(("-", "#"))]
    uncommented = [line for line in keyed if " # " not in line]
    assert uncommented == []


def test_a_misspelt_key_is_named(tmp_path: Path) -> None:
    message = _error(_write(tmp_path, "polling:\n  intervl: 1000\n"))
    assert "polling.intervl: unknown key" in message


def test_a_misspelt_section_is_named(tmp_path: Path) -> None:
    assert "upsteam: unknown key" in _error(_write(tmp_path, "upsteam:\n  url: http://127.0.0.1:9/mcp\n"))


def test_a_bad_value_is_named_with_its_key(tmp_path: Path) -> None:
    assert "listen.port:" in _error(_write(tmp_path, "listen:\n  port: x\n"))


def test_every_bad_key_is_reported_at_once(tmp_path: Path) -> None:
    message = _error(_write(tmp_path, "listen:\n  port: x\nupstream:\n  url: ftp://x\n  timeot_s: 3\n"))
    assert "listen.port:" in message
    assert "upstream.url: " in message and "http://" in message
    assert "upstream.timeot_s: unknown key" in message


def test_min_interval_above_max_interval_fails_naming_both(tmp_path: Path) -> None:
    message = _error(_write(tmp_path, "polling:\n  min_interval_ms: 5000\n  max_interval_ms: 1000\n"))
    assert "polling: min_interval_ms (5000) must not exceed max_interval_ms (1000)" in message
    assert "Value error" not in message


def test_a_section_with_every_key_commented_out_means_defaults(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, "metrics:\n  # path: /metrics\nlisten:\n  port: 9\n"), environ={})
    assert config.metrics == SidecarConfig().metrics
    assert config.listen.port == 9


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "upstream:\n  timeout_s: 30\n")
    environ = {
        "MCP_SIDECAR__UPSTREAM__TIMEOUT_S": "7.5",
        "MCP_SIDECAR__LISTEN__PORT": "0",
        "MCP_SIDECAR__UPSTREAM__FORWARD_HEADERS": "[Authorization, X-Tenant]",
        "OTHER_VARIABLE": "ignored",
    }
    config = load_config(path, environ=environ)
    assert config.upstream.timeout_s == 7.5
    assert config.listen.port == 0
    assert config.upstream.forward_headers == ["authorization", "x-tenant"]


def test_a_bad_environment_override_is_named(tmp_path: Path) -> None:
    assert "upstream.timeout_s:" in _error(environ={"MCP_SIDECAR__UPSTREAM__TIMEOUT_S": "soon"})
    assert "polling.intervl: unknown key" in _error(environ={"MCP_SIDECAR__POLLING__INTERVL": "5"})
    assert "MCP_SIDECAR__TIMEOUT_S" in _error(environ={"MCP_SIDECAR__TIMEOUT_S": "5"})


_SECRET_YAML = """
upstream:
  headers:
    x-api-key: s3cret-api-key
bus:
  backend: redis
  redis_url: redis://:hunter2-password@redis.internal:6379/0
"""


def test_secrets_never_show_in_repr_or_json(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, _SECRET_YAML), environ={})
    for shown in (repr(config), str(config), config.model_dump_json(), repr(config.upstream), repr(config.bus)):
        assert "s3cret-api-key" not in shown
        assert "hunter2-password" not in shown
    assert "x-api-key" in config.model_dump_json()  # the header's name is not a secret
    assert config.upstream.headers["x-api-key"].get_secret_value() == "s3cret-api-key"
    assert "hunter2-password" in config.bus.redis_url.get_secret_value()


def test_secrets_survive_overrides_and_stay_hidden(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, _SECRET_YAML), environ={}).with_overrides({"listen": {"port": 0}})
    assert config.upstream.headers["x-api-key"].get_secret_value() == "s3cret-api-key"
    assert "s3cret-api-key" not in repr(config)


def test_a_config_error_does_not_echo_a_secret(tmp_path: Path) -> None:
    message = _error(_write(tmp_path, _SECRET_YAML + "listen:\n  port: x\n"))
    assert "listen.port:" in message
    assert "s3cret-api-key" not in message and "hunter2-password" not in message


@pytest.mark.parametrize("version", ["2025-11-25", "2026-07-28"])
def test_an_unquoted_protocol_version_reads_as_the_version_not_a_date(tmp_path: Path, version: str) -> None:
    path = _write(tmp_path, f"upstream:\n  protocol: {version}\n")
    assert load_config(path, environ={}).upstream.protocol == version


def test_an_environment_override_error_names_the_variable() -> None:
    message = _error(environ={"MCP_SIDECAR__LISTEN__PORT": "eighty"})
    assert "listen.port:" in message and "(from MCP_SIDECAR__LISTEN__PORT)" in message
    message = _error(environ={"MCP_SIDECAR__UPSTREAM__FORWARD_HEADERS": "[unclosed"})
    assert "MCP_SIDECAR__UPSTREAM__FORWARD_HEADERS" in message
