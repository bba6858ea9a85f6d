"""Real MCP upstreams (official SDK, one subprocess each) and an async handle to drive them.

Usage, the one supported shape::

    async with await start_upstream("legacy") as up:   # started and ready here
        ...  # point the sidecar at up.url; steer with await up.set_price(140) etc.
    # leaving the block stops the process (SIGTERM, SIGKILL after 5 s)

``start_upstream`` returns a started :class:`Upstream`; entering it does nothing more and
leaving it calls :meth:`Upstream.stop`. ``era="modern"`` is the dual-era 2.3 server without
subscriptions; ``era="legacy"`` only speaks the handshake era (2025-11-25). See
``tests/peers/shop_server.py`` for the resources, tools and admin routes.

``start_bare_upstream`` starts ``tests/peers/bare_server.py`` the same way: a lowlevel-``Server``
upstream with resources and tools but no prompts (only the log and health admin routes work).

``start_conformance_upstream`` starts ``tests/peers/conformance_server.py``: the fixture names the
official conformance suite's server scenarios call (dual era; only the log and health admin routes).
"""

from __future__ import annotations

import os
import ssl
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import aiohttp

from tests.procs import OnLoopback, ServerProcess, free_port, http_answers

__all__ = [
    "BARE_SERVER",
    "CONFORMANCE_SERVER",
    "SHOP_SERVER",
    "PeerTLS",
    "Upstream",
    "start_bare_upstream",
    "start_conformance_upstream",
    "start_upstream",
]

READY_TIMEOUT_S = 15.0
STOP_GRACE_S = 5.0

Era = Literal["modern", "legacy"]
Kind = Literal["tool", "prompt", "resource", "template"]

SHOP_SERVER = "tests.peers.shop_server"
BARE_SERVER = "tests.peers.bare_server"
CONFORMANCE_SERVER = "tests.peers.conformance_server"


@dataclass(frozen=True)
class PeerTLS:
    """HTTPS for a peer server: its certificate and key files, the CA whose client certificates it requires
    (None: none required), and the client context the tests use to reach its admin routes."""

    cert: Path
    key: Path
    client: ssl.SSLContext
    client_ca: Path | None = None

    def argv(self) -> list[str]:
        args = ["--tls-cert", str(self.cert), "--tls-key", str(self.key)]
        return [*args, "--tls-client-ca", str(self.client_ca)] if self.client_ca else args


class Upstream(OnLoopback):
    """One peer-server subprocess (``module``, the shop server by default) on 127.0.0.1; admin calls go
    over HTTP to the same port."""

    def __init__(
        self,
        era: Era,
        port: int,
        *,
        read_ttl_ms: int = 1000,
        list_ttl_ms: int = 1000,
        module: str = SHOP_SERVER,
        auth: bool = False,
        native: bool = False,
        session_auth: bool = False,
        tls: PeerTLS | None = None,
    ) -> None:
        self.era = era
        self.tls = tls
        self.native = native
        self.session_auth = session_auth
        self.module = module
        self.auth = auth
        self.port = port
        self.read_ttl_ms = read_ttl_ms
        self.list_ttl_ms = list_ttl_ms
        fd, path = tempfile.mkstemp(prefix=f"shop-{era}-{port}-", suffix=".log")
        os.close(fd)
        self.log_path = Path(path)
        self._process: ServerProcess | None = None

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.running

    async def start(self) -> None:
        """Spawn the server (appending to ``log_path``) and wait until /admin/health answers."""
        if self.running:
            raise RuntimeError(f"upstream on port {self.port} is already running")
        args = [
            sys.executable, "-m", self.module, "--port", str(self.port), "--era", self.era,
            "--read-ttl-ms", str(self.read_ttl_ms), "--list-ttl-ms", str(self.list_ttl_ms),
            *(["--auth"] if self.auth else []),
            *(["--native"] if self.native else []),
            *(["--session-auth"] if self.session_auth else []),
            *(self.tls.argv() if self.tls else []),
        ]  # fmt: skip
        self._process = ServerProcess(f"{self.module}:{self.port}", args, self.log_path)
        ssl = self.tls.client if self.tls else None
        await self._process.start(
            http_answers(f"{self.base_url}/admin/health", timeout_s=1.0, ssl=ssl), READY_TIMEOUT_S
        )

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's stdout/stderr."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    async def kill(self) -> None:
        """SIGKILL the server and reap it; a no-op when it is not running."""
        if self._process is not None:
            await self._process.kill()

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``STOP_GRACE_S``; a no-op when it is not running."""
        if self._process is not None:
            await self._process.stop(STOP_GRACE_S)

    async def restart(self) -> None:
        """Stop if running, then start again on the same port (fresh state, empty log)."""
        await self.stop()
        await self.start()

    async def __aenter__(self) -> Upstream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
        if exc is None:  # keep the server's output when the block failed
            self.log_path.unlink(missing_ok=True)

    # -- admin API ---------------------------------------------------------------------------

    async def _admin(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        ssl = self.tls.client if self.tls else True
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.request(method, f"{self.base_url}/admin/{path}", json=body, ssl=ssl) as resp,
        ):
            resp.raise_for_status()
            return await resp.json()

    async def set_price(self, value: int) -> None:
        """Change the price out of band (no MCP request involved)."""
        await self._admin("POST", "set", {"price": value})

    async def set_note(self, text: str | None, *, fail_reads: int = 0) -> None:
        """Write ``catalog://note`` out of band, or delete it (None: its reads then fail with -32603); with
        ``fail_reads`` its next reads fail that many times, as if it were gone, before it answers again."""
        await self._admin("POST", "note", {"text": text, "fail_reads": fail_reads})

    async def bump_profile(self, token: str) -> str:
        """Bump the profile version of ``token`` (Authorization value without ``Bearer``)."""
        result = await self._admin("POST", "profile", {"token": token, "bump": True})
        return str(result["text"])

    async def add(self, kind: Kind, name: str) -> None:
        """Register a tool, prompt, resource (``catalog://extra/<name>``) or template
        (``catalog://t/<name>/{id}``) at runtime."""
        await self._admin("POST", "add", {"kind": kind, "name": name})

    async def log(self) -> list[dict[str, Any]]:
        """Every JSON-RPC message received on /mcp since start or the last reset."""
        entries: list[dict[str, Any]] = await self._admin("GET", "log")
        return entries

    async def reset_log(self) -> None:
        await self._admin("POST", "reset-log")

    async def grant(self, token: str) -> None:
        """``--auth`` servers: accept ``Bearer <token>`` from now on."""
        await self._admin("POST", "grant", {"token": token})

    async def revoke(self, token: str) -> None:
        """``--auth`` servers: later requests with ``token`` get 401."""
        await self._admin("POST", "revoke", {"token": token})

    async def forbid(self, token: str) -> None:
        """``--auth`` servers: later requests with ``token`` get 403 (insufficient scope)."""
        await self._admin("POST", "forbid", {"token": token})

    async def notify(self, *, uri: str | None = None, list_kind: str | None = None) -> None:
        """``--native`` servers: announce a change that did not happen (a URI, or tools, prompts, resources)."""
        await self._admin("POST", "notify", {"uri": uri} if uri is not None else {"list": list_kind})

    async def count(self, method: str, uri: str | None = None) -> int:
        """How many logged messages have ``method`` (and ``uri``, when given)."""
        return sum(1 for e in await self.log() if e["method"] == method and (uri is None or e["uri"] == uri))


async def start_upstream(
    era: Era,
    *,
    port: int | None = None,
    read_ttl_ms: int = 1000,
    list_ttl_ms: int = 1000,
    auth: bool = False,
    native: bool = False,
    session_auth: bool = False,
    tls: PeerTLS | None = None,
) -> Upstream:
    """Start a shop server of ``era`` on ``port`` (a free one if None) and wait until it is ready; ``auth``
    starts it OAuth-protected, ``native`` serving its own listen, ``session_auth`` binding each session to the
    token that opened it (see ``shop_server``), ``tls`` serving HTTPS (requiring a client certificate when its
    ``client_ca`` is set)."""
    upstream = Upstream(
        era,
        port or free_port(),
        read_ttl_ms=read_ttl_ms,
        list_ttl_ms=list_ttl_ms,
        auth=auth,
        native=native,
        session_auth=session_auth,
        tls=tls,
    )
    await upstream.start()
    return upstream


async def start_bare_upstream(
    era: Era = "modern", *, port: int | None = None, read_ttl_ms: int = 1000, list_ttl_ms: int = 1000
) -> Upstream:
    """Start a bare server (resources and tools, no prompts) of ``era`` and wait until it is ready."""
    upstream = Upstream(era, port or free_port(), read_ttl_ms=read_ttl_ms, list_ttl_ms=list_ttl_ms, module=BARE_SERVER)
    await upstream.start()
    return upstream


async def start_conformance_upstream(
    *, port: int | None = None, read_ttl_ms: int = 1000, list_ttl_ms: int = 1000
) -> Upstream:
    """Start the conformance fixture (dual era) and wait until it is ready."""
    upstream = Upstream(
        "modern", port or free_port(), read_ttl_ms=read_ttl_ms, list_ttl_ms=list_ttl_ms, module=CONFORMANCE_SERVER
    )
    await upstream.start()
    return upstream
