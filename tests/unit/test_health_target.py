"""Where `mcp-sidecar health` asks: the listener the configuration names, on loopback when it is bound to every
interface, over HTTPS when it serves TLS, and the admin listener when the MCP one wants client certificates."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from sidecar.commands.health import ProbeError, Target, probe_target
from sidecar.config import load_config

UPSTREAM = {"upstream": {"url": "http://127.0.0.1:9/mcp"}}


@pytest.mark.parametrize(
    ("host", "asked", "url"),
    [
        ("0.0.0.0", "127.0.0.1", "http://127.0.0.1:8080/healthz"),
        ("::", "::1", "http://[::1]:8080/healthz"),
        ("10.1.2.3", "10.1.2.3", "http://10.1.2.3:8080/healthz"),
        ("localhost", "localhost", "http://localhost:8080/healthz"),
    ],
)
def test_every_interface_is_asked_on_loopback_and_an_address_as_it_is(host: str, asked: str, url: str) -> None:
    target = probe_target(load_config(environ={}, overrides={**UPSTREAM, "listen": {"host": host}}))
    assert target == Target("listen", tls=False, host=asked, port=8080) and target.url == url


def test_tls_and_client_certificates_choose_the_scheme_and_the_listener(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert, key, ca_file = (tmp_path / name for name in ("tls.crt", "tls.key", "ca.pem"))
    leaf = ca.issue_cert("127.0.0.1")
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    tls = {"cert_file": str(cert), "key_file": str(key)}
    served = load_config(environ={}, overrides={**UPSTREAM, "listen": {"port": 8443, "tls": tls}})
    assert probe_target(served).url == "https://127.0.0.1:8443/healthz"
    mutual = {**tls, "client_ca_file": str(ca_file)}
    asked = load_config(environ={}, overrides={**UPSTREAM, "listen": {"tls": mutual}, "admin": {"port": 9465}})
    assert probe_target(asked) == Target("admin", tls=False, host="127.0.0.1", port=9465)


def test_a_port_picked_at_start_cannot_be_asked() -> None:
    config = load_config(environ={}, overrides={**UPSTREAM, "listen": {"port": 0}, "admin": {"port": 0}})
    with pytest.raises(ProbeError, match=r"listen\.port is 0 .*; admin\.port is 0 "):
        probe_target(config)
