"""Nothing the sidecar shows carries a secret (invariant 25): a distinct secret planted in every place the
configuration can hold one, and every surface swept for each, in every state of the upstream.

The places: an HTTP upstream URL's userinfo password and a credential query parameter, a header value; a stdio
command's `env` value, a database URL's password and a credential query parameter among its arguments (how
`server-postgres` and hosted servers are run). The surfaces: the client listener (`/readyz`, `/healthz`, the
JSON-RPC errors of a request and of a listen), the admin listener (`/readyz`, `/status` as JSON and as HTML,
`/metrics`), every log line at debug level, the spans exported over OTLP, and `check-config`. The states: an HTTP
upstream up, then down; a stdio child that dies at start over and over (printing its arguments and environment on
stderr, as a traceback may); a stdio child that serves, and times out a request. Each sidecar is a real process.

The sweep also checks what must stay: the admin listener and the log name the upstream's host, port and path, and
a command's program and plain arguments; the client listener names nothing of the upstream at all.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from tests.cluster import Replica, free_port, sidecar_config
from tests.kit import LEGACY_HEADERS, LEGACY_INITIALIZE, cli, cli_env, eventually, listen_request, rpc, sse_messages
from tests.kit.otlp import otlp_receiver
from tests.kit.wire import headers
from tests.peers import start_upstream

SECRETS = {
    "url userinfo password": "uinfoPw7c1e",
    "url query credential": "qryKey9a3b",
    "header value": "hdrVal51d0",
    "env value": "envVal3f8e",
    "stdio argument url password": "argPwc27a",
    "stdio argument query credential": "argTok6b94",
}
DB_URL = f"postgresql://app:{SECRETS['stdio argument url password']}@db.internal:5432/shop"
API_URL = f"https://api.example/v1?token={SECRETS['stdio argument query credential']}&region=eu"
_SAYS_ALL = "import os, sys; print('connecting with', sys.argv[1:], os.environ['API_KEY'], file=sys.stderr, flush=True)"
DIES = _SAYS_ALL + "; raise RuntimeError('cannot reach ' + sys.argv[1] + ' as ' + os.environ['API_KEY'])"
SERVES = _SAYS_ALL + "; os.execv(sys.executable, [sys.executable, '-m', 'tests.peers.stdio_toy_server'])"
"""Python standing in for a server run with credentials: it prints them on stderr (a traceback may), then dies
or becomes the hand-written 2025-11-25 toy server (tests/peers/stdio_toy_server.py)."""
TRACING = {
    "OTEL_TRACES_EXPORTER": "otlp",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    "OTEL_BSP_SCHEDULE_DELAY": "100",
}
RESTARTS = {"restart_backoff_initial_ms": 50, "restart_backoff_max_ms": 200}


def _http_config(upstream_port: int) -> dict[str, Any]:
    url = (
        f"http://sweeper:{SECRETS['url userinfo password']}@127.0.0.1:{upstream_port}/mcp"
        f"?api_key={SECRETS['url query credential']}&tenant=shop"
    )
    config = sidecar_config(url, free_port(), logging={"level": "debug"})
    config["upstream"].update({"headers": {"x-api-key": SECRETS["header value"]}, "timeout_s": 2})
    return config


def _stdio_config(script: str, **upstream: Any) -> dict[str, Any]:
    config = sidecar_config("http://unused.invalid/mcp", free_port(), logging={"level": "debug"})
    config["upstream"] = {
        "command": [sys.executable, "-c", script, DB_URL, "--api-url", API_URL],
        "env": {"API_KEY": SECRETS["env value"]},
        **upstream,
    }
    return config


class Sweep:
    """Everything shown, by where and when it was shown."""

    def __init__(self) -> None:
        self.shown: list[tuple[str, str]] = []
        self.client: list[tuple[str, str]] = []

    def saw(self, where: str, text: str, *, client: bool = False) -> str:
        self.shown.append((where, text))
        if client:
            self.client.append((where, text))
        return text

    def leaks(self) -> Iterator[str]:
        for where, text in self.shown:
            for place, secret in SECRETS.items():
                if secret in text:
                    yield f"the {place} on {where}"

    async def listeners(self, http: aiohttp.ClientSession, replica: Replica, state: str) -> dict[str, Any]:
        """Every listener surface of `replica` now; returns the admin listener's /readyz body."""
        admin = f"http://127.0.0.1:{replica.admin_port}"
        for path in ("/readyz", "/healthz"):
            async with http.get(replica.base_url + path) as resp:
                self.saw(f"{state}: client {path}", await resp.text(), client=True)
        for path, accept in (("/readyz", "*/*"), ("/status", "application/json"), ("/status", "text/html")):
            async with http.get(admin + path, headers={"Accept": accept}) as resp:
                self.saw(f"{state}: admin {path} ({accept})", await resp.text())
        async with http.get(admin + "/metrics") as resp:
            self.saw(f"{state}: admin /metrics", await resp.text())
        for method, params in (
            ("resources/read", {"uri": "catalog://price"}),
            ("tools/call", {"name": "hang", "arguments": {}}),
        ):
            _, answer = await rpc(http, replica.url, method, params)
            self.saw(f"{state}: client {method}", orjson.dumps(answer).decode(), client=True)
        body = listen_request(["catalog://price"], "sweep")
        async with http.post(replica.url, json=body, headers=headers("subscriptions/listen")) as resp:
            if resp.content_type == "text/event-stream":
                first = await anext(sse_messages(resp))
                self.saw(f"{state}: client listen", orjson.dumps(first).decode(), client=True)
            else:
                self.saw(f"{state}: client listen", await resp.text(), client=True)
        async with http.post(replica.url, json=LEGACY_INITIALIZE, headers=LEGACY_HEADERS) as resp:
            self.saw(f"{state}: client 2025-11-25 initialize", await resp.text(), client=True)
        async with http.get(admin + "/readyz") as resp:
            ready: dict[str, Any] = await resp.json()
        return ready

    async def check_config(self, tmp_path: Path, name: str, config: dict[str, Any]) -> str:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        async with cli("check-config", str(path), env=cli_env()) as run:
            assert await run.exit_code() == 0, run.output()
            return self.saw(f"check-config ({name})", run.output())


async def _serving(replica: Replica) -> bool:
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with aiohttp.ClientSession() as http, http.get(f"{replica.base_url}/healthz") as resp:
            return resp.status == 200
    return False


async def _restarts(replica: Replica) -> float:
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        return (await replica.metrics()).total("mcp_sidecar_upstream_restarts_total")
    return 0.0


@pytest.mark.invariant(25)
async def test_no_planted_secret_shows_on_any_surface_in_any_state(tmp_path: Path) -> None:
    sweep = Sweep()
    replicas: list[Replica] = []
    async with otlp_receiver() as (endpoint, exports), aiohttp.ClientSession() as http:
        env = {**TRACING, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
        try:
            # An HTTP upstream, up then down.
            shop = await start_upstream("modern")
            config = _http_config(shop.port)
            shown = await sweep.check_config(tmp_path, "http", config)
            assert f"127.0.0.1:{shop.port}/mcp" in shown and "tenant=shop" in shown, shown  # what stays
            replica = Replica("http", tmp_path / "http", config, env=env)
            replicas.append(replica)
            await replica.start()
            ready = await sweep.listeners(http, replica, "http upstream up")
            assert ready["status"] == "ready" and f"127.0.0.1:{shop.port}/mcp" in ready["upstream"], ready
            await shop.kill()
            await eventually(lambda: _not_ready(replica), what="the sidecar saw the upstream down")
            ready = await sweep.listeners(http, replica, "http upstream down")
            assert ready["status"] == "not ready" and f"127.0.0.1:{shop.port}/mcp" in ready["upstream"], ready

            # A stdio child that dies at start, again and again.
            config = _stdio_config(DIES, **RESTARTS)
            shown = await sweep.check_config(tmp_path, "stdio crash loop", config)
            assert "@db.internal:5432/shop" in shown and "--api-url" in shown, shown  # the secrets: swept below
            replica = Replica("stdio-crash-loop", tmp_path / "crash-loop", config, env=env)
            replicas.append(replica)
            await replica.service.start(lambda: _serving(replica))
            await eventually(lambda: _at_least(replica, 2), what="the child restarted twice")
            for sample in range(3):
                ready = await sweep.listeners(http, replica, f"stdio crash loop, sample {sample}")
                assert ready["status"] == "not ready" and "cannot reach postgresql://app:" in str(ready["reason"]), (
                    ready
                )

            # A stdio child that serves, and a request it never answers.
            config = _stdio_config(SERVES, timeout_s=3)  # time for a loaded machine to start it
            await sweep.check_config(tmp_path, "stdio", config)
            replica = Replica("stdio", tmp_path / "stdio", config, env=env)
            replicas.append(replica)
            await replica.start()
            ready = await sweep.listeners(http, replica, "stdio upstream up")
            assert ready["status"] == "ready" and ready["upstream"].startswith(f"stdio: {sys.executable} -c"), ready
            assert "@db.internal:5432/shop --api-url" in ready["upstream"], ready

            await eventually(lambda: len(exports) > 0, what="spans exported")
        finally:
            for replica in replicas:
                await replica.service.stop()
        for replica in replicas:
            sweep.saw(f"the log of {replica.name}", replica.service.log_text())
        sweep.saw("the exported spans", "\n".join(str(export) for export in exports))

    assert list(sweep.leaks()) == []
    for replica in replicas:  # the log names the upstream and what the child said, masked
        log = replica.service.log_text()
        assert "***" in log and ("127.0.0.1" in log or "db.internal" in log), replica.name
    for where, text in sweep.client:  # the client listener names nothing of the upstream
        for named in ("db.internal", "api.example", "stdio:", "sweeper", "tenant=shop"):
            assert named not in text, f"{named!r} on {where}: {text}"


async def _not_ready(replica: Replica) -> bool:
    return (await replica.readyz())[0] == 503


async def _at_least(replica: Replica, restarts: int) -> bool:
    return await _restarts(replica) >= restarts
