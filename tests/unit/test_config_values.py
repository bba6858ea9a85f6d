"""What the configuration's text keys must be (URLs, hosts, paths, origins, headers, the stdio working directory,
TLS files), checked when the file loads: each mistake is one line naming its key, never echoing a secret."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme
import yaml

from sidecar.config import ConfigError, load_config

UPSTREAM = "upstream:\n  url: http://127.0.0.1:9000/mcp\n"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sidecar.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    return str(info.value)


# -- what the text keys must look like: checked when the file loads, naming the key ----------------------------


def test_each_problem_is_one_line_naming_its_key(tmp_path: Path) -> None:
    text = "upstream:\n  url: http://127.0.0.1:99999/mcp\nlisten:\n  host: '127.0.0.1:8080'\n"
    lines = _error(_write(tmp_path, text)).splitlines()
    assert sorted(line.split(":", 1)[0] for line in lines) == ["listen.host", "upstream.url"], lines


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://127.0.0.1:99999/mcp", "the port 99999 is out of range (1-65535)"),
        ("http://127.0.0.1:0/mcp", "the port 0 is out of range"),
        ("http://127.0.0.1:abc/mcp", "the port 'abc' is not a number"),
        ("http://[::1/mcp", "the IPv6 address has no closing ']'"),
        ("http://[::zz]:80/mcp", "[::zz] is not an IPv6 address"),
        ("http://::1:80/mcp", "an IPv6 address must be written in brackets"),
        ("http:///mcp", "has no host"),
        ("http://user:pw-secret@:80/mcp", "there is no host"),
        ("http://user:pw-secret@exa mple/mcp", "must not contain spaces"),
        ("http://api.example.com:443\r\n/mcp", "control characters"),
        ("http://-api.example.com/mcp", "is not a valid host name"),
        ("ftp://api.example.com/mcp", "must be an http:// or https:// URL"),
    ],
)
def test_an_upstream_url_that_cannot_be_connected_to_is_refused(tmp_path: Path, url: str, problem: str) -> None:
    path = _write(tmp_path, yaml.safe_dump({"upstream": {"url": url}}))
    message = _error(path)
    assert message.startswith("upstream.url: ") and problem in message, message
    assert "pw-secret" not in message
    public = yaml.safe_dump({"upstream": {"url": "http://127.0.0.1:9/mcp", "public_url": url}})
    assert _error(_write(tmp_path, public)).startswith("upstream.public_url: ")


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1]:8080/mcp",
        "http://[fe80::1%25eth0]:8080/mcp",
        "https://user:p%40ss@api.example.com/mcp?tenant=a#x",
        "http://localhost/mcp",
        "http://mcp_server.internal.:65535",
        "http://bücher.example/mcp",
    ],
)
def test_upstream_urls_that_can_be_connected_to_load(tmp_path: Path, url: str) -> None:
    assert load_config(_write(tmp_path, yaml.safe_dump({"upstream": {"url": url}})), environ={}).upstream.url == url


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis://:pw-secret@127.0.0.1:99999/0", "the port 99999 is out of range"),
        ("rediss://:pw-secret@127.0.0.1:six/0", "the port 'six' is not a number"),
        ("redis://[::1:6379/0", "no closing ']'"),
        ("redis://127.0.0.1:6379/zero", "the database 'zero' is not a number"),
        ("redis+cluster://:pw-secret@a:7000,b:70000", "the port 70000 is out of range"),
        ("redis+cluster://a:7000,[::1:7001", "no closing ']'"),
        ("unix://", "unix:// needs the socket's path"),
    ],
)
def test_a_redis_url_whose_host_port_or_database_cannot_be_used_is_refused(
    tmp_path: Path, url: str, problem: str
) -> None:
    message = _error(_write(tmp_path, UPSTREAM + yaml.safe_dump({"bus": {"redis_url": url}})))
    assert message.startswith("bus.redis_url: ") and problem in message, message
    assert "pw-secret" not in message


@pytest.mark.parametrize("url", ["redis://", "redis://:6379/0", "redis://[::1]:6379/1", "redis+cluster://[::1]:7000"])
def test_redis_urls_the_client_can_use_load(tmp_path: Path, url: str) -> None:
    config = load_config(_write(tmp_path, UPSTREAM + yaml.safe_dump({"bus": {"redis_url": url}})), environ={})
    assert config.bus.redis_url.get_secret_value() == url


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ({"x-api-key": "k\r\nX-Injected: 1"}, "the value of header 'x-api-key' holds a control character ('\\r')"),
        ({"x-api-key": "k\nX-Injected: 1"}, "holds a control character ('\\n')"),
        ({"x-api-key": "k\x00"}, "holds a control character ('\\x00')"),
        ({"x api key": "k"}, "header name 'x api key' holds ' '"),
        ({"x-api-key:": "k"}, "holds ':'"),
        ({"": "k"}, "header name '' is empty"),
    ],
)
def test_an_upstream_header_that_would_break_the_request_is_refused(
    tmp_path: Path, headers: dict[str, str], problem: str
) -> None:
    upstream = {"url": "http://127.0.0.1:9000/mcp", "headers": headers}
    message = _error(_write(tmp_path, yaml.safe_dump({"upstream": upstream})))
    assert message.startswith("upstream.headers: ") and problem in message, message
    assert "X-Injected" not in message  # a header value may be a secret: never echoed


def test_a_header_value_with_a_tab_and_non_ascii_text_loads(tmp_path: Path) -> None:
    upstream = {"url": "http://127.0.0.1:9000/mcp", "headers": {"x-note": "a\tb ünï"}}
    config = load_config(_write(tmp_path, yaml.safe_dump({"upstream": upstream})), environ={})
    assert config.upstream.headers["x-note"].get_secret_value() == "a\tb ünï"


@pytest.mark.parametrize("key", ["forward_headers", "non_identity_headers"])
def test_a_forwarded_header_name_that_is_not_a_token_is_refused(tmp_path: Path, key: str) -> None:
    message = _error(_write(tmp_path, UPSTREAM + f"  {key}: ['x tenant']\n"))
    assert message.startswith(f"upstream.{key}: header name 'x tenant' holds ' '"), message


def test_a_stdio_working_directory_must_exist(tmp_path: Path) -> None:
    stdio = "upstream:\n  command: [server]\n  cwd: '{}'\n"
    missing = _error(_write(tmp_path, stdio.format(tmp_path / "nope")))
    assert missing.startswith("upstream.cwd: ") and "is not a directory (it does not exist)" in missing
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert _error(_write(tmp_path, stdio.format(a_file))).endswith("is not a directory")
    assert load_config(_write(tmp_path, stdio.format(tmp_path)), environ={}).upstream.cwd == str(tmp_path)


def test_a_stdio_environment_name_that_cannot_be_passed_is_refused(tmp_path: Path) -> None:
    message = _error(_write(tmp_path, "upstream:\n  command: [server]\n  env: {'TOKEN=x': y}\n"))
    assert message.startswith("upstream.env: 'TOKEN=x' is not an environment variable name"), message


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("listen:\n  host: '127.0.0.1:8080'\n", "listen.host: '127.0.0.1:8080' is not a host name (the port is"),
        ("listen:\n  host: '[::1]'\n", "listen.host: '[::1]' is not an IPv6 address (written without brackets"),
        ("admin:\n  host: http://0.0.0.0\n", "admin.host: 'http://0.0.0.0' is not a host name (a host only"),
        ("admin:\n  host: 'my host'\n", "admin.host: 'my host' is not a valid host name"),
        ("listen:\n  path: '/mcp/{tenant}'\n", "listen.path: must not contain '{'"),
        ("listen:\n  path: '/mcp here'\n", "listen.path: must not contain ' '"),
        ("metrics:\n  path: metrics\n", "metrics.path: must start with '/'"),
        ("metrics:\n  path: /metrics?x=1\n", "metrics.path: must not contain '?'"),
        ("listen:\n  allowed_origins: ['https://app.example.com/']\n", "listen.allowed_origins: origin 'https://app"),
        ("listen:\n  allowed_origins: [app.example.com]\n", "is not scheme://host[:port]"),
        ("listen:\n  allowed_origins: ['https://app:99999']\n", "the port 99999 is out of range"),
        ("tracing:\n  endpoint: 'collector:4318'\n", "tracing.endpoint: must be an http:// or https:// URL"),
        ("tracing:\n  endpoint: 'http://[::1:4318/v1/traces'\n", "tracing.endpoint: the IPv6 address has no"),
    ],
)
def test_hosts_paths_origins_and_endpoints_are_checked(tmp_path: Path, text: str, problem: str) -> None:
    message = _error(_write(tmp_path, UPSTREAM + text))
    assert problem in message, message


def test_listener_hosts_paths_and_origins_that_work_load(tmp_path: Path) -> None:
    text = (
        "listen:\n  host: '::'\n  path: /v1/mcp\n  allowed_origins: ['https://app.example.com', 'http://[::1]:3000']\n"
        "admin:\n  host: 0.0.0.0\nmetrics:\n  path: /internal/metrics\ntracing:\n  endpoint: http://otel:4318/v1/traces\n"
    )
    config = load_config(_write(tmp_path, UPSTREAM + text), environ={})
    assert (config.listen.host, config.admin.host, config.metrics.path) == ("::", "0.0.0.0", "/internal/metrics")


# -- TLS files: loaded with the ssl module when the configuration is --------------------------------------------


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from cryptography.hazmat.primitives import serialization

    folder = tmp_path_factory.mktemp("pem")
    ca = trustme.CA()
    leaf, other = ca.issue_cert("localhost"), ca.issue_cert("other.localhost")
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase"),
    )
    contents = {
        "ca": ca.cert_pem.bytes(),
        "cert": leaf.cert_chain_pems[0].bytes(),
        "key": leaf.private_key_pem.bytes(),
        "other_key": other.private_key_pem.bytes(),
        "encrypted_key": encrypted,
        "notpem": b"not a certificate\n",
        "broken": b"-----BEGIN CERTIFICATE-----\nbm90IGRlcg==\n-----END CERTIFICATE-----\n",
    }
    for name, content in contents.items():
        (folder / name).write_bytes(content)
    return {name: str(folder / name) for name in contents}


@pytest.mark.parametrize("section", ["listen", "admin"])
def test_a_listeners_certificate_key_and_client_ca_load(tmp_path: Path, pem: dict[str, str], section: str) -> None:
    tls = {"cert_file": pem["cert"], "key_file": pem["key"], "client_ca_file": pem["ca"]}
    config = load_config(_write(tmp_path, UPSTREAM + yaml.safe_dump({section: {"tls": tls}})), environ={})
    assert getattr(config, section).tls.enabled


@pytest.mark.parametrize(
    ("tls", "problem"),
    [
        ({"cert_file": "notpem", "key_file": "key"}, "cert_file: '{notpem}' is not a PEM certificate"),
        ({"cert_file": "broken", "key_file": "key"}, "cert_file: '{broken}': a certificate in it cannot be read"),
        ({"cert_file": "key", "key_file": "cert"}, "cert_file: '{key}' holds a private key, not a certificate: are it"),
        ({"cert_file": "key", "key_file": "cert"}, "key_file: '{cert}' holds a certificate, not a private key"),
        ({"cert_file": "cert", "key_file": "other_key"}, "key_file: '{other_key}' is not the private key of cert_file"),
        ({"cert_file": "cert", "key_file": "encrypted_key"}, "key_file: '{encrypted_key}' is an encrypted key"),
        ({"cert_file": "cert", "key_file": "notpem"}, "key_file: '{notpem}' is not a PEM private key"),
        ({"cert_file": "cert", "key_file": "key", "client_ca_file": "key"}, "client_ca_file: '{key}' holds no PEM"),
        ({"cert_file": "cert", "key_file": "key", "client_ca_file": "broken"}, "client_ca_file: '{broken}': a cert"),
        ({"cert_file": "cert", "key_file": "nope"}, "key_file: '{nope}' is not a readable file"),
    ],
)
@pytest.mark.parametrize("section", ["listen", "admin"])
def test_listener_tls_files_that_cannot_serve_are_refused(
    tmp_path: Path, pem: dict[str, str], section: str, tls: dict[str, str], problem: str
) -> None:
    files = {**pem, "nope": str(tmp_path / "nope")}
    text = UPSTREAM + yaml.safe_dump({section: {"tls": {key: files[name] for key, name in tls.items()}}})
    message = _error(_write(tmp_path, text))
    assert f"{section}.tls.{problem.format(**files)}" in message, message


@pytest.mark.parametrize(
    ("tls", "problem"),
    [
        ({"ca_file": "notpem"}, "ca_file: '{notpem}' holds no PEM certificate"),
        ({"ca_file": "key"}, "ca_file: '{key}' holds no PEM certificate"),
        ({"client_cert_file": "cert", "client_key_file": "other_key"}, "client_key_file: '{other_key}' is not the "),
        ({"client_cert_file": "notpem", "client_key_file": "key"}, "client_cert_file: '{notpem}' is not a PEM cert"),
        ({"client_cert_file": "cert", "client_key_file": "encrypted_key"}, "client_key_file: '{encrypted_key}' is an"),
    ],
)
def test_upstream_tls_files_that_cannot_be_used_are_refused(
    tmp_path: Path, pem: dict[str, str], tls: dict[str, str], problem: str
) -> None:
    upstream = {"url": "https://127.0.0.1:9/mcp", "tls": {key: pem[name] for key, name in tls.items()}}
    message = _error(_write(tmp_path, yaml.safe_dump({"upstream": upstream})))
    assert f"upstream.tls.{problem.format(**pem)}" in message, message


def test_upstream_tls_files_that_work_load(tmp_path: Path, pem: dict[str, str]) -> None:
    tls = {"ca_file": pem["ca"], "client_cert_file": pem["cert"], "client_key_file": pem["key"], "server_name": "api"}
    upstream = {"url": "https://127.0.0.1:9/mcp", "tls": tls}
    assert load_config(_write(tmp_path, yaml.safe_dump({"upstream": upstream})), environ={}).upstream.tls.configured
    upstream["tls"] = {"server_name": "api example"}
    assert "upstream.tls.server_name: 'api example' is not a valid host name" in _error(
        _write(tmp_path, yaml.safe_dump({"upstream": upstream}))
    )


# -- revalidate.tools: which tool calls make the watches look ----------------------------------------------------


def test_tool_rules_load_from_the_file_and_from_the_environment(tmp_path: Path) -> None:
    text = (
        UPSTREAM
        + "revalidate:\n  tools:\n    - {match: 'get_*', revalidate: false}\n    - {match: '*', revalidate: true}\n"
    )
    rules = load_config(_write(tmp_path, text), environ={}).revalidate.tools
    assert [(rule.match, rule.revalidate) for rule in rules] == [("get_*", False), ("*", True)]
    environ = {"MCP_SIDECAR__REVALIDATE__TOOLS": '[{match: "query", revalidate: false}]'}
    rules = load_config(_write(tmp_path, UPSTREAM), environ=environ).revalidate.tools
    assert [(rule.match, rule.revalidate) for rule in rules] == [("query", False)]


@pytest.mark.parametrize(
    ("rules", "problem"),
    [
        pytest.param(
            "[{match: 5, revalidate: false}]",
            "revalidate.tools[0].match: Input should be a valid string",
            id="glob-type",
        ),
        pytest.param(
            "[{match: 'a b', revalidate: false}]", "revalidate.tools[0].match: 'a b': a tool name glob", id="space"
        ),
        pytest.param("[{match: '', revalidate: false}]", "revalidate.tools[0].match: an empty glob", id="empty"),
        pytest.param("[{match: query}]", "revalidate.tools[0].revalidate: Field required", id="no-revalidate"),
        pytest.param("[{revalidate: true}]", "revalidate.tools[0].match: Field required", id="no-match"),
        pytest.param(
            "[{match: q, revalidate: maybe}]",
            "revalidate.tools[0].revalidate: Input should be a valid boolean",
            id="not-a-boolean",
        ),
        pytest.param(
            "[{match: q, revalidate: true, readonly: true}]",
            "revalidate.tools[0].readonly: unknown key",
            id="unknown-key",
        ),
        pytest.param("{match: q, revalidate: true}", "revalidate.tools: Input should be a valid list", id="not-a-list"),
    ],
)
def test_a_bad_tool_rule_fails_at_start_naming_its_key(tmp_path: Path, rules: str, problem: str) -> None:
    assert _error(_write(tmp_path, f"{UPSTREAM}revalidate:\n  tools: {rules}\n")).startswith(problem)
