"""Configuration: the example file is complete and current, errors name the key, env overrides, hidden secrets."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from sidecar.config import ConfigError, SidecarConfig, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "sidecar.example.yaml"
SECTIONS = {name: field.annotation for name, field in SidecarConfig.model_fields.items()}
UPSTREAM = "upstream:\n  url: http://127.0.0.1:9000/mcp\n"
"""The one key without a default (the example file's upstream)."""


def _defaults() -> SidecarConfig:
    return SidecarConfig.model_validate({"upstream": {"url": "http://127.0.0.1:9000/mcp"}})


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sidecar.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _error(path: Path | None = None, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, environ=environ or {})
    return str(info.value)


def test_the_example_file_loads_and_holds_every_default() -> None:
    assert load_config(EXAMPLE, environ={}) == _defaults()


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
    config = load_config(_write(tmp_path, UPSTREAM + "metrics:\n  # path: /metrics\nlisten:\n  port: 9\n"), environ={})
    assert config.metrics == _defaults().metrics
    assert config.listen.port == 9


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, UPSTREAM + "  timeout_s: 30\n")
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


def test_hints_settle_ms_is_set_by_file_or_environment_and_bounded(tmp_path: Path) -> None:
    assert _defaults().hints.settle_ms == 3000
    path = _write(tmp_path, UPSTREAM + "hints:\n  settle_ms: 5000\n")
    assert load_config(path, environ={}).hints.settle_ms == 5000
    assert load_config(path, environ={"MCP_SIDECAR__HINTS__SETTLE_MS": "0"}).hints.settle_ms == 0
    for bad in ("-1", "60001", "soon"):
        message = _error(_write(tmp_path, UPSTREAM), environ={"MCP_SIDECAR__HINTS__SETTLE_MS": bad})
        assert "hints.settle_ms:" in message and "(from MCP_SIDECAR__HINTS__SETTLE_MS)" in message


_SECRET_YAML = """
upstream:
  url: http://127.0.0.1:9000/mcp
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
    path = _write(tmp_path, UPSTREAM + f"  protocol: {version}\n")
    assert load_config(path, environ={}).upstream.protocol == version


def test_an_environment_override_error_names_the_variable() -> None:
    message = _error(environ={"MCP_SIDECAR__LISTEN__PORT": "eighty"})
    assert "listen.port:" in message and "(from MCP_SIDECAR__LISTEN__PORT)" in message
    message = _error(environ={"MCP_SIDECAR__UPSTREAM__FORWARD_HEADERS": "[unclosed"})
    assert "MCP_SIDECAR__UPSTREAM__FORWARD_HEADERS" in message


# -- the upstream: an HTTP endpoint or a stdio server, exactly one -------------------------------------------


def test_without_an_upstream_the_error_names_both_ways_to_give_one(tmp_path: Path) -> None:
    message = _error(_write(tmp_path, "listen:\n  port: 9\n"))
    assert "upstream: neither url nor command is set" in message
    assert "upstream.url" in message and "upstream.command" in message


def test_url_and_command_together_are_refused(tmp_path: Path) -> None:
    message = _error(_write(tmp_path, UPSTREAM + "  command: [uvx, mcp-server-time]\n"))
    assert "upstream: url and command are both set; keep one of them" in message


def test_a_command_string_is_split_as_a_shell_would_without_a_shell(tmp_path: Path) -> None:
    text = "upstream:\n  command: \"npx -y '@scope/server' --root '/srv/my files'\"\n"
    config = load_config(_write(tmp_path, text), environ={})
    assert config.upstream.command == ["npx", "-y", "@scope/server", "--root", "/srv/my files"]
    assert config.upstream.is_stdio
    assert config.upstream.display_url == "stdio: npx -y @scope/server --root '/srv/my files'"


def test_an_empty_command_is_refused(tmp_path: Path) -> None:
    assert "upstream.command: must name a program" in _error(_write(tmp_path, "upstream:\n  command: []\n"))


def test_command_environment_values_are_secrets(tmp_path: Path) -> None:
    text = f"upstream:\n  command: [server]\n  env:\n    API_TOKEN: s3cret-env-value\n  cwd: {tmp_path}\n"
    config = load_config(_write(tmp_path, text), environ={})
    assert config.upstream.env["API_TOKEN"].get_secret_value() == "s3cret-env-value"
    for shown in (repr(config), config.model_dump_json(), config.upstream.display_url):
        assert "s3cret-env-value" not in shown
    assert "API_TOKEN" in config.model_dump_json()


@pytest.mark.parametrize(
    ("text", "named"),
    [
        pytest.param(UPSTREAM + "  env: {A: b}\n", "upstream.env and upstream.cwd are for upstream.command", id="env"),
        pytest.param(UPSTREAM + "  cwd: /srv\n", "upstream.env and upstream.cwd are for upstream.command", id="cwd"),
        pytest.param(
            UPSTREAM + "  inherit_env: [GITHUB_TOKEN]\n",
            "upstream.inherit_env is for upstream.command",
            id="inherit_env",
        ),
        pytest.param(
            "upstream:\n  command: [server]\n  headers: {x-api-key: k}\n",
            "upstream.headers is for an HTTP",
            id="headers",
        ),
        pytest.param(
            "upstream:\n  command: [server]\n  public_url: http://sidecar/mcp\n", "upstream.public_url is", id="public"
        ),
    ],
)
def test_keys_of_the_other_kind_of_upstream_are_refused(tmp_path: Path, text: str, named: str) -> None:
    assert named in _error(_write(tmp_path, text))


def test_inherit_env_takes_only_environment_variable_names(tmp_path: Path) -> None:
    path = _write(tmp_path, "upstream:\n  command: [server]\n  inherit_env: [GITHUB_TOKEN, _private, HTTPS-PROXY]\n")
    assert "upstream.inherit_env: 'HTTPS-PROXY' is not an environment variable name" in _error(path)
    named = _write(tmp_path, "upstream:\n  command: [server]\n  inherit_env: [GITHUB_TOKEN, _private, a1]\n")
    assert load_config(named, environ={}).upstream.inherit_env == ["GITHUB_TOKEN", "_private", "a1"]


def test_a_stdio_url_is_pointed_at_command(tmp_path: Path) -> None:
    message = _error(_write(tmp_path, "upstream:\n  url: uvx mcp-server-time\n"))
    assert "upstream.url: must be an http:// or https:// URL (a stdio server goes in upstream.command)" in message


def test_the_environment_naming_a_command_replaces_the_files_url(tmp_path: Path) -> None:
    path = _write(tmp_path, UPSTREAM + "  headers: {x-api-key: k}\n  timeout_s: 7\n")
    config = load_config(path, environ={"MCP_SIDECAR__UPSTREAM__COMMAND": "python -m my_server --flag"})
    assert config.upstream.command == ["python", "-m", "my_server", "--flag"]
    assert config.upstream.url == "" and config.upstream.headers == {}  # the HTTP upstream's keys went with it
    assert config.upstream.timeout_s == 7
    both = {"MCP_SIDECAR__UPSTREAM__COMMAND": "server", "MCP_SIDECAR__UPSTREAM__URL": "http://127.0.0.1:9/mcp"}
    assert "url and command are both set" in _error(path, both)


def test_an_override_naming_the_upstream_replaces_the_one_below_it(tmp_path: Path) -> None:
    path = _write(tmp_path, "upstream:\n  command: [server]\n  env: {A: b}\n")
    config = load_config(path, environ={}, overrides={"upstream": {"url": "http://127.0.0.1:9/mcp"}})
    assert config.upstream.url == "http://127.0.0.1:9/mcp" and config.upstream.command is None
    assert config.upstream.env == {}
    back = config.with_overrides({"upstream": {"command": "other --x"}})
    assert back.upstream.command == ["other", "--x"] and back.upstream.url == ""


def test_restart_backoff_bounds_are_ordered(tmp_path: Path) -> None:
    text = "upstream:\n  command: [s]\n  restart_backoff_initial_ms: 900\n  restart_backoff_max_ms: 100\n"
    assert "restart_backoff_initial_ms (900) must not exceed restart_backoff_max_ms (100)" in _error(
        _write(tmp_path, text)
    )


@pytest.mark.parametrize(
    "url",
    ["http://:pw-secret@redis.internal:6379/0", "redis.internal:6379", "redis+cluster://:pw-secret@a:7000,b"],
    ids=["unknown-scheme", "no-scheme", "seed-without-port"],
)
def test_a_redis_url_the_bus_cannot_use_is_an_error_naming_the_key(tmp_path: Path, url: str) -> None:
    message = _error(_write(tmp_path, UPSTREAM + f"bus:\n  backend: redis\n  redis_url: '{url}'\n"))
    assert "bus.redis_url:" in message, message
    assert "pw-secret" not in message


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:6379/0", "rediss://h:6380", "unix:///run/redis.sock", "redis+cluster://u:p@a:7000,b:7001"],
)
def test_single_redis_and_cluster_urls_load(tmp_path: Path, url: str) -> None:
    config = load_config(_write(tmp_path, UPSTREAM + f"bus:\n  redis_url: '{url}'\n"), environ={})
    assert config.bus.redis_url.get_secret_value() == url
