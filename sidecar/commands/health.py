"""`mcp-sidecar health`: ask a running sidecar's `/healthz` where its configuration says it listens, for a
container HEALTHCHECK or a Kubernetes exec probe; exit 0 or 1 with a one-line reason.

The configuration is read as `run` reads it (the file, the `MCP_SIDECAR__` environment, the address flags), so the
probe follows a port or `listen.tls` set anywhere instead of guessing one."""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import socket
import ssl
import sys
from dataclasses import dataclass
from typing import Any

from sidecar.config import ConfigError, SidecarConfig, load_config
from sidecar.config.tls import ListenerTLS

__all__ = ["DEFAULT_TIMEOUT_S", "ProbeError", "Target", "add_health_command", "probe", "probe_target", "run_health"]

DEFAULT_TIMEOUT_S = 5.0
"""Connect, handshake and answer together; under a HEALTHCHECK's --timeout, so the reason is printed, not cut."""
_ANY_ADDRESS = {"0.0.0.0": "127.0.0.1", "::": "::1"}
"""A listener bound to every interface is asked on the loopback address of the same family."""
_NO_UPSTREAM = {"upstream": {"url": "http://127.0.0.1/mcp"}}
"""The probe does not talk to the upstream: one given to `run` as a flag, which the probe cannot see, is not missed."""


class ProbeError(Exception):
    """Why the sidecar is not healthy, or cannot be asked; one line."""


@dataclass(frozen=True)
class Target:
    """The listener the probe asks, and where."""

    listener: str
    """`listen` or `admin`: the configuration section whose address it is."""
    tls: bool
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}/healthz"


def add_health_command(commands: Any) -> argparse.ArgumentParser:
    """The `health` subcommand (`commands`: argparse's subparsers); the address flags are added with run's."""
    health: argparse.ArgumentParser = commands.add_parser(
        "health",
        help="ask a running sidecar's /healthz where its configuration says it listens; exit 0 or 1",
        description="Read the configuration as `run` does (the file, MCP_SIDECAR__ variables, the flags) and ask "
        "/healthz on the MCP listener (the admin listener when the MCP one asks for client certificates), over "
        "HTTPS when it serves TLS. Exits 0 when it answers 200, 1 otherwise, with one line saying why. For a "
        "container HEALTHCHECK or a Kubernetes exec probe.",
    )
    health.add_argument(
        "--config", dest="run_config", metavar="FILE", help="YAML config file (default: $MCP_SIDECAR_CONFIG)"
    )
    health.add_argument(
        "--ca-file",
        metavar="FILE",
        help="PEM CA bundle the listener's certificate must chain to, its name checked too (--server-name); "
        "without it, a loopback listener's certificate is not checked (the probe asks its own host), any other "
        "against the system's trust store",
    )
    health.add_argument(
        "--server-name", metavar="NAME", help="the name the certificate must hold (default: the address asked)"
    )
    health.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"how long to wait for the answer (default {DEFAULT_TIMEOUT_S:g})",
    )
    return health


def run_health(args: argparse.Namespace, path: str | None, overrides: dict[str, dict[str, Any]]) -> int:
    """Probe, print one line (stdout when healthy, stderr when not), and return the exit code."""
    try:
        config = load_config(path, overrides={**overrides, **_NO_UPSTREAM})
    except ConfigError as exc:
        print(f"unhealthy: configuration: {'; '.join(str(exc).splitlines())}", file=sys.stderr)
        return 1
    try:
        target = probe_target(config)
        status = probe(target, timeout_s=args.timeout, ca_file=args.ca_file, server_name=args.server_name)
    except ProbeError as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    print(f"healthy: {target.url} answered {status}")
    return 0


def probe_target(config: SidecarConfig) -> Target:
    """The MCP listener, or the admin listener when the MCP one wants client certificates (the probe has none)."""
    reasons = []
    for name, host, port, tls in (
        ("listen", config.listen.host, config.listen.port, config.listen.tls),
        ("admin", config.admin.host, config.admin.port, config.admin.tls),
    ):
        reason = _unaskable(name, port, tls)
        if reason is None:
            return Target(name, tls.enabled, _ANY_ADDRESS.get(host, host), port)
        reasons.append(reason)
    raise ProbeError(f"no listener to ask: {'; '.join(reasons)}")


def _unaskable(name: str, port: int, tls: ListenerTLS) -> str | None:
    if port == 0:
        return f"{name}.port is 0 (a free port picked at start, which the probe cannot know)"
    if tls.client_ca_file is not None:
        return f"{name}.tls.client_ca_file asks for a client certificate, which the probe does not have"
    return None


def probe(target: Target, *, timeout_s: float, ca_file: str | None = None, server_name: str | None = None) -> int:
    """GET the target's /healthz: 200, or ProbeError saying what came instead."""
    try:
        with socket.create_connection((target.host, target.port), timeout=timeout_s) as raw:
            context = _tls_context(target, ca_file) if target.tls else None
            sock = raw if context is None else context.wrap_socket(raw, server_hostname=server_name or target.host)
            with sock:
                host = f"[{target.host}]" if ":" in target.host else target.host
                request = f"GET /healthz HTTP/1.1\r\nHost: {host}:{target.port}\r\nConnection: close\r\n\r\n"
                sock.sendall(request.encode("ascii"))
                answer = http.client.HTTPResponse(sock)
                answer.begin()
                status = answer.status
    except ProbeError:
        raise
    except ssl.SSLCertVerificationError as exc:
        raise ProbeError(f"{target.url}: its certificate is not trusted: {exc.verify_message}") from None
    except ssl.SSLError as exc:
        raise ProbeError(f"{target.url}: TLS: {exc.reason or exc}") from None
    except TimeoutError:
        raise ProbeError(f"{target.url}: no answer within {timeout_s:g} s") from None
    except http.client.HTTPException as exc:
        raise ProbeError(f"{target.url}: not an HTTP answer ({type(exc).__name__}): is it {_other(target)}?") from None
    except OSError as exc:
        raise ProbeError(f"{target.url}: {(exc.strerror or str(exc)).lower()}") from None
    if status != 200:
        raise ProbeError(f"{target.url} answered {status}")
    return status


def _other(target: Target) -> str:
    return "plain HTTP" if target.tls else "HTTPS"


def _tls_context(target: Target, ca_file: str | None) -> ssl.SSLContext:
    if ca_file is not None:
        try:
            return ssl.create_default_context(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ProbeError(f"--ca-file {ca_file}: cannot load it: {exc}") from None
    if _is_loopback(target.host):
        # The probe asks its own host over loopback: nobody stands between to impersonate the sidecar, and the
        # certificate is for the name clients use, not for 127.0.0.1.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    return ssl.create_default_context()


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost" or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
