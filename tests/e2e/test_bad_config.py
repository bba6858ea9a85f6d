"""Every key that takes a path, URL, pattern, host or header, given a bad value, as an operator meets it: both
`check-config FILE` and `run --config FILE` exit non-zero with a line `mcp-sidecar: <key>: <problem>` and no
traceback. What `run` would refuse, `check-config` refuses first.

A second test walks the configuration model: a new text key without a bad-value row here fails it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from pydantic import BaseModel, SecretStr

from sidecar.config import SidecarConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
EXIT_TIMEOUT_S = 20.0
"""A refused configuration exits at once; one that is served instead runs into this."""

HTTP = {"url": "http://127.0.0.1:9/mcp"}
HTTPS = {"url": "https://127.0.0.1:9/mcp"}
STDIO = {"command": [sys.executable, "-c", "pass"]}


def _row(key: str, section: dict[str, Any], id: str) -> Any:
    return pytest.param(key, section, id=id)


BAD_VALUES = [
    # The fifteen mistakes first met: each passed check-config, and run printed a traceback or started anyway.
    _row("upstream.url", {"upstream": {"url": "http://127.0.0.1:99999/mcp"}}, "common-url-port-out-of-range"),
    _row("upstream.url", {"upstream": {"url": "http://127.0.0.1:abc/mcp"}}, "common-url-port-not-a-number"),
    _row("upstream.url", {"upstream": {"url": "http://[::1/mcp"}}, "common-url-broken-ipv6"),
    _row("upstream.url", {"upstream": {"url": "http:///mcp"}}, "common-url-no-host"),
    _row("bus.redis_url", {"bus": {"backend": "redis", "redis_url": "redis://127.0.0.1:99999/0"}}, "common-redis-port"),
    _row(
        "listen.tls.cert_file",
        {"listen": {"tls": {"cert_file": "{notpem}", "key_file": "{key}"}}},
        "common-listen-cert-not-pem",
    ),
    _row(
        "admin.tls.cert_file",
        {"admin": {"tls": {"cert_file": "{notpem}", "key_file": "{key}"}}},
        "common-admin-cert-not-pem",
    ),
    _row(
        "listen.tls.cert_file",
        {"listen": {"tls": {"cert_file": "{key}", "key_file": "{cert}"}}},
        "common-cert-and-key-swapped",
    ),
    _row(
        "listen.tls.key_file",
        {"listen": {"tls": {"cert_file": "{cert}", "key_file": "{other_key}"}}},
        "common-key-of-another-cert",
    ),
    _row(
        "listen.tls.client_ca_file",
        {"listen": {"tls": {"cert_file": "{cert}", "key_file": "{key}", "client_ca_file": "{key}"}}},
        "common-client-ca-without-certificate",
    ),
    _row("upstream.tls.ca_file", {"upstream": {**HTTPS, "tls": {"ca_file": "{notpem}"}}}, "common-upstream-ca-not-pem"),
    _row(
        "upstream.tls.client_key_file",
        {"upstream": {**HTTPS, "tls": {"client_cert_file": "{cert}", "client_key_file": "{other_key}"}}},
        "common-upstream-client-pair",
    ),
    _row("upstream.cwd", {"upstream": {**STDIO, "cwd": "/nonexistent/working-directory"}}, "common-stdio-cwd-missing"),
    _row(
        "upstream.headers", {"upstream": {**HTTP, "headers": {"x-api-key": "k\r\nX-Injected: 1"}}}, "common-header-crlf"
    ),
    _row("upstream.headers", {"upstream": {**HTTP, "headers": {"x-api-key": "k\nX-Injected: 1"}}}, "common-header-lf"),
    # Every other such key.
    _row("upstream.url", {"upstream": {"url": "http://exa mple/mcp"}}, "url-space-in-host"),
    _row("upstream.url", {"upstream": {"url": "http://[fe80::zz]:8080/mcp"}}, "url-not-ipv6"),
    _row("upstream.url", {"upstream": {"url": "uvx mcp-server-time"}}, "url-is-a-command"),
    _row(
        "upstream.public_url",
        {"upstream": {**HTTP, "public_url": "https://sidecar.example.com:0/mcp"}},
        "public-url-port",
    ),
    _row("upstream.public_url", {"upstream": {**HTTP, "public_url": "https:///mcp"}}, "public-url-no-host"),
    _row("upstream.command", {"upstream": {"command": ""}}, "command-empty"),
    _row("upstream.command", {"upstream": {"command": "server --name 'unclosed"}}, "command-unsplittable"),
    _row("upstream.env", {"upstream": {**STDIO, "env": {"TOKEN=x": "y"}}}, "env-name"),
    _row("upstream.inherit_env", {"upstream": {**STDIO, "inherit_env": ["HTTPS PROXY"]}}, "inherit-env-name"),
    _row("upstream.cwd", {"upstream": {**STDIO, "cwd": "{cert}"}}, "cwd-is-a-file"),
    _row("upstream.headers", {"upstream": {**HTTP, "headers": {"x api key": "k"}}}, "header-name"),
    _row("upstream.forward_headers", {"upstream": {**HTTP, "forward_headers": ["x-tenant:"]}}, "forward-header-name"),
    _row(
        "upstream.non_identity_headers",
        {"upstream": {**HTTP, "non_identity_headers": ["trace parent"]}},
        "non-identity-header",
    ),
    _row("upstream.tls.ca_file", {"upstream": {**HTTPS, "tls": {"ca_file": "{empty}"}}}, "upstream-ca-empty"),
    _row(
        "upstream.tls.ca_file",
        {"upstream": {**HTTPS, "tls": {"ca_file": "/nonexistent/ca.pem"}}},
        "upstream-ca-missing",
    ),
    _row(
        "upstream.tls.client_cert_file",
        {"upstream": {**HTTPS, "tls": {"client_cert_file": "{notpem}", "client_key_file": "{key}"}}},
        "upstream-client-cert-not-pem",
    ),
    _row(
        "upstream.tls.client_key_file",
        {"upstream": {**HTTPS, "tls": {"client_cert_file": "{cert}", "client_key_file": "{encrypted_key}"}}},
        "upstream-client-key-encrypted",
    ),
    _row("upstream.tls.server_name", {"upstream": {**HTTPS, "tls": {"server_name": "api example.com"}}}, "server-name"),
    _row("bus.redis_url", {"bus": {"backend": "redis", "redis_url": "redis://127.0.0.1:six/0"}}, "redis-port-text"),
    _row("bus.redis_url", {"bus": {"backend": "redis", "redis_url": "redis://[::1:6379/0"}}, "redis-broken-ipv6"),
    _row("bus.redis_url", {"bus": {"backend": "redis", "redis_url": "redis://127.0.0.1:6379/zero"}}, "redis-db"),
    _row(
        "bus.redis_url", {"bus": {"backend": "redis", "redis_url": "redis+cluster://a:7000,b:70000"}}, "redis-seed-port"
    ),
    _row("listen.host", {"listen": {"host": "127.0.0.1:8080"}}, "listen-host-with-port"),
    _row("listen.path", {"listen": {"path": "/mcp/{tenant}"}}, "listen-path-pattern"),
    _row("listen.allowed_origins", {"listen": {"allowed_origins": ["https://app.example.com/"]}}, "origin-with-path"),
    _row("listen.allowed_origins", {"listen": {"allowed_origins": ["app.example.com"]}}, "origin-without-scheme"),
    _row("listen.trusted_proxies", {"listen": {"trusted_proxies": ["10.0.0.0/33"]}}, "trusted-proxy-cidr"),
    _row(
        "listen.tls.key_file",
        {"listen": {"tls": {"cert_file": "{cert}", "key_file": "{notpem}"}}},
        "listen-key-not-pem",
    ),
    _row("admin.host", {"admin": {"host": "http://0.0.0.0"}}, "admin-host-url"),
    _row(
        "admin.tls.key_file", {"admin": {"tls": {"cert_file": "{cert}", "key_file": "{other_key}"}}}, "admin-key-pair"
    ),
    _row(
        "admin.tls.client_ca_file",
        {"admin": {"tls": {"cert_file": "{cert}", "key_file": "{key}", "client_ca_file": "{empty}"}}},
        "admin-client-ca-empty",
    ),
    _row("metrics.path", {"metrics": {"path": "metrics"}}, "metrics-path-relative"),
    _row("metrics.path", {"metrics": {"path": "/metrics?format=text"}}, "metrics-path-query"),
    _row("hints.token_file", {"hints": {"token_file": "/nonexistent/hints-token"}}, "hints-token-file-missing"),
    _row("hints.token_file", {"hints": {"token_file": "{empty}"}}, "hints-token-file-empty"),
    _row("tracing.endpoint", {"tracing": {"endpoint": "collector:4318"}}, "tracing-endpoint-no-scheme"),
    _row("tracing.endpoint", {"tracing": {"endpoint": "http://collector:431800/v1/traces"}}, "tracing-endpoint-port"),
    _row("polling.rules[1].match", {"polling": {"rules": [{"match": "a://*"}, {"match": "a:// b"}]}}, "rule-glob"),
    _row(
        "polling.rules[0].ignore.json_pointers[0]",
        {"polling": {"rules": [{"match": "a://*", "ignore": {"json_pointers": ["generatedAt"]}}]}},
        "rule-pointer",
    ),
    _row(
        "polling.rules[0].ignore.patterns[1]",
        {"polling": {"rules": [{"match": "a://*", "ignore": {"patterns": ["id=\\d+", "([a-z]"]}}]}},
        "rule-pattern",
    ),
    _row(
        "revalidate.tools[1].match",
        {
            "revalidate": {
                "tools": [{"match": "read_*", "revalidate": False}, {"match": "query all", "revalidate": True}]
            }
        },
        "tool-rule-glob",
    ),
]

FREE_TEXT = {"tracing.service_name": "any name is a service name"}
"""Text keys no value of which is wrong."""


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Files the rows name as {placeholder}: a certificate and its key, another certificate's key, an encrypted key,
    a file that is not PEM, an empty file."""
    folder = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    leaf, other = ca.issue_cert("localhost", "127.0.0.1"), ca.issue_cert("other.localhost")
    files = {
        "cert": leaf.cert_chain_pems[0].bytes(),
        "key": leaf.private_key_pem.bytes(),
        "other_key": other.private_key_pem.bytes(),
        "encrypted_key": _encrypted(leaf.private_key_pem.bytes()),
        "notpem": b"this is not a certificate\n",
        "empty": b"",
    }
    for name, content in files.items():
        (folder / f"{name}.pem").write_bytes(content)
    return {name: str(folder / f"{name}.pem") for name in files}


def _encrypted(key_pem: bytes) -> bytes:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(key_pem, password=None)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase"),
    )


def _filled(value: Any, files: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {key: _filled(item, files) for key, item in value.items()}
    if isinstance(value, list):
        return [_filled(item, files) for item in value]
    if isinstance(value, str) and value.startswith("{") and value.endswith("}") and value[1:-1] in files:
        return files[value[1:-1]]
    return value


def _config(section: dict[str, Any], files: dict[str, str]) -> dict[str, Any]:
    """The row's sections over a config that is otherwise valid (HTTP upstream, free ports)."""
    config: dict[str, Any] = {"upstream": dict(HTTP), "listen": {"port": 0}, "admin": {"port": 0}}
    for name, values in _filled(section, files).items():
        config[name] = {**config.get(name, {}), **values}
    if "command" in config["upstream"]:
        del config["upstream"]["url"]
    return config


def _env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MCP_SIDECAR__")}
    return {**env, "PYTHONUNBUFFERED": "1"}


def _refusals(*commands: list[str]) -> list[tuple[str, int | None, str, str]]:
    """Each command's (name, exit code, stdout, stderr), the commands run side by side; one still running after
    EXIT_TIMEOUT_S (it took the bad value and served) is killed, its exit code None."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "sidecar.cli", *command],
            cwd=REPO_ROOT,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    results: list[tuple[str, int | None, str, str]] = []
    for command, proc in zip(commands, procs, strict=True):
        try:
            out, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            code = None
        results.append((command[0], code, out, err))
    return results


@pytest.mark.parametrize(("key", "section"), BAD_VALUES)
def test_a_bad_value_is_refused_by_check_config_and_by_run_naming_the_key(
    tmp_path: Path, material: dict[str, str], key: str, section: dict[str, Any]
) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text(yaml.safe_dump(_config(section, material)), encoding="utf-8")
    for name, code, out, err in _refusals(["check-config", str(path)], ["run", "--config", str(path)]):
        shown = f"{name} exited {code}\n{err}" if code is not None else f"{name} took the bad value and ran\n{err}"
        assert code is not None and code != 0, shown
        assert f"mcp-sidecar: {key}: " in err, shown
        assert "Traceback" not in err, shown
        assert all(line.startswith("mcp-sidecar: ") for line in err.splitlines()), shown
        assert out == "", shown


def _text_keys(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """The dotted keys whose values are written as text (a path, URL, pattern, host, header, command...)."""
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _text_keys(annotation, f"{prefix}{name}.")
        elif typing.get_origin(annotation) is list and _model(typing.get_args(annotation)[0]):
            yield from _text_keys(typing.get_args(annotation)[0], f"{prefix}{name}[].")
        elif _holds_text(annotation):
            yield prefix + name


def _model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _walked(key: str) -> str:
    """A row's key as the walk names it: any position in a list written `[]`, none after the last name."""
    return re.sub(r"\[\d+\]", "[]", key).removesuffix("[]")


def _holds_text(annotation: Any) -> bool:
    if typing.get_origin(annotation) is typing.Literal:
        return False  # a choice among fixed words: the model itself names the ones allowed
    if annotation in (str, SecretStr):
        return True
    return any(_holds_text(arg) for arg in typing.get_args(annotation))


def test_every_text_key_of_the_model_has_a_bad_value_row() -> None:
    keys = set(_text_keys(SidecarConfig))
    covered = {_walked(str(param.values[0])) for param in BAD_VALUES}
    assert keys - covered - set(FREE_TEXT) == set(), "a key that takes text needs a bad-value row in BAD_VALUES"
    assert covered | set(FREE_TEXT) <= keys, "a row names a key the model does not have"
