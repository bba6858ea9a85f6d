"""`mcp-sidecar health` as a container HEALTHCHECK runs it: a process beside a running `mcp-sidecar run`, reading the
same file, environment and flags, asking /healthz where they say, over HTTPS when `listen.tls` is set; exit 0, or
1 with one line saying why."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trustme
import yaml

from tests.kit.cli import REPO_ROOT, START_TIMEOUT_S, Cli, cli, cli_env
from tests.procs import free_port

UNREACHABLE_UPSTREAM = "http://127.0.0.1:9/mcp"
"""/healthz answers while the process runs, whatever the upstream does: none is needed here."""


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str

    @property
    def line(self) -> str:
        """The one line printed (stdout when healthy, stderr when not)."""
        (line,) = (self.stdout + self.stderr).splitlines()
        return line


async def _health(*args: str, env: dict[str, str] | None = None) -> Outcome:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sidecar.cli", "health", *args, cwd=REPO_ROOT, env=env or cli_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(START_TIMEOUT_S):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return Outcome(proc.returncode, out.decode(), err.decode())


def _write(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


async def _listening(run: Cli) -> None:
    await run.wait_for_line("stderr", r"mcp-sidecar listening")


async def test_it_asks_where_the_file_the_environment_and_the_flags_say_and_fails_once_the_sidecar_is_gone(
    tmp_path: Path,
) -> None:
    in_file, in_env, admin = free_port(), free_port(), free_port()
    path = _write(
        tmp_path / "sidecar.yaml",
        {"upstream": {"url": UNREACHABLE_UPSTREAM}, "listen": {"port": in_file}, "admin": {"port": admin}},
    )
    moved = cli_env(MCP_SIDECAR__LISTEN__PORT=str(in_env))  # the environment wins over the file
    async with cli("run", "--config", str(path), env=moved) as run:
        await _listening(run)
        healthy = await _health("--config", str(path), env=moved)
        assert healthy.code == 0 and healthy.line == f"healthy: http://127.0.0.1:{in_env}/healthz answered 200"
        # The file alone names a port nobody listens on: the probe says so, rather than passing by luck.
        alone = await _health("--config", str(path))
        assert alone.code == 1
        assert alone.line == f"unhealthy: http://127.0.0.1:{in_file}/healthz: connection refused", alone
        # A flag wins over both; MCP_SIDECAR_CONFIG names the file when --config does not.
        flagged = await _health("--port", str(in_env), env=cli_env(MCP_SIDECAR_CONFIG=str(path)))
        assert flagged.code == 0, flagged
        assert await run.stop() == 0
    gone = await _health("--config", str(path), env=moved)
    assert gone.code == 1 and gone.line == f"unhealthy: http://127.0.0.1:{in_env}/healthz: connection refused"


async def test_it_speaks_https_to_a_tls_listener_and_checks_the_certificate_against_a_ca_it_is_given(
    tmp_path: Path,
) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "catalog-mcp")
    cert, key, ca_file, other_ca = (tmp_path / name for name in ("tls.crt", "tls.key", "ca.pem", "other-ca.pem"))
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    port = free_port()
    config = {
        "upstream": {"url": UNREACHABLE_UPSTREAM},
        "listen": {"port": port, "tls": {"cert_file": str(cert), "key_file": str(key)}},
        "admin": {"port": free_port()},
    }
    path = _write(tmp_path / "sidecar.yaml", config)
    url = f"https://127.0.0.1:{port}/healthz"
    async with cli("run", "--config", str(path), env=cli_env()) as run:
        await _listening(run)
        # On loopback the probe asks its own host: the certificate (for the clients' name) is not checked.
        unchecked = await _health("--config", str(path))
        assert unchecked.code == 0 and unchecked.line == f"healthy: {url} answered 200", unchecked
        checked = await _health("--config", str(path), "--ca-file", str(ca_file))
        assert checked.code == 0, checked
        by_name = await _health("--config", str(path), "--ca-file", str(ca_file), "--server-name", "catalog-mcp")
        assert by_name.code == 0, by_name
        wrong_ca = await _health("--config", str(path), "--ca-file", str(other_ca))
        assert wrong_ca.code == 1 and wrong_ca.line.startswith(f"unhealthy: {url}: its certificate is not trusted")
        wrong_name = await _health("--config", str(path), "--ca-file", str(ca_file), "--server-name", "elsewhere")
        assert wrong_name.code == 1 and "not trusted" in wrong_name.line, wrong_name
        assert await run.stop() == 0


async def test_a_listener_that_wants_client_certificates_is_passed_over_for_the_admin_one(tmp_path: Path) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    cert, key, ca_file = (tmp_path / name for name in ("tls.crt", "tls.key", "ca.pem"))
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    admin = free_port()
    tls = {"cert_file": str(cert), "key_file": str(key), "client_ca_file": str(ca_file)}
    config = {"upstream": {"url": UNREACHABLE_UPSTREAM}, "listen": {"port": free_port(), "tls": tls}}
    path = _write(tmp_path / "sidecar.yaml", {**config, "admin": {"port": admin}})
    async with cli("run", "--config", str(path), env=cli_env()) as run:
        await _listening(run)
        healthy = await _health("--config", str(path))
        assert healthy.code == 0 and healthy.line == f"healthy: http://127.0.0.1:{admin}/healthz answered 200"
        # Both listeners asking for one: nothing the probe can ask, and it says why instead of failing a handshake.
        both = _write(tmp_path / "both.yaml", {**config, "admin": {"port": admin, "tls": tls}})
        neither = await _health("--config", str(both))
        assert neither.code == 1 and "listen.tls.client_ca_file" in neither.line, neither
        assert "admin.tls.client_ca_file" in neither.line
        assert await run.stop() == 0
