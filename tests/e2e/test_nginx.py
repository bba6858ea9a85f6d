"""config/nginx/mcp-sidecar.conf in a real nginx in front of a sidecar: requests and listen streams pass through,
events arrive as they happen and uncompressed, and the operator endpoints stay private.

Skips where nginx is not installed (a failure under CI). nginx runs as a child of the test (one process, no
daemon) on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from tests.kit import UPDATED, ListenStream, Sidecar, rpc, serve_sidecar
from tests.peers import Upstream
from tests.prereqs import require_binary
from tests.procs import ServerProcess, free_port, http_answers

REPO_ROOT = Path(__file__).resolve().parents[2]
SITE = REPO_ROOT / "config" / "nginx" / "mcp-sidecar.conf"
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0
PRICE = "catalog://price"


def _site(sidecar: Sidecar, port: int) -> str:
    """The example site with its listen address and sidecar address replaced, nothing else."""
    text = SITE.read_text(encoding="utf-8")
    text, listens = re.subn(r"^(\s*)listen 80;", rf"\1listen 127.0.0.1:{port};", text, flags=re.M)
    sidecar_address = sidecar.base_url.removeprefix("http://")
    text, servers = re.subn(r"server 127\.0\.0\.1:8080;", f"server {sidecar_address};", text)
    assert listens == 1 and servers == 1, "the example's listen or upstream server line changed"
    return text


@contextlib.asynccontextmanager
async def _nginx(tmp_path: Path, sidecar: Sidecar) -> AsyncIterator[str]:
    binary = require_binary("nginx", needed_by="the nginx example test")
    port = free_port()
    (tmp_path / "site.conf").write_text(_site(sidecar, port), encoding="utf-8")
    temp = {name: tmp_path / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
    main = "\n".join(
        [
            "daemon off;",
            "master_process off;",  # one process as the test's user: no workers to switch users for
            f"pid {tmp_path / 'nginx.pid'};",
            f"error_log {tmp_path / 'error.log'} warn;",
            "events {}",
            "http {",
            "  access_log off;",
            "  gzip on;",  # as many servers have it: the site must still turn it off for event streams
            "  gzip_types text/event-stream application/json;",
            "  gzip_min_length 1;",
            *(f"  {name}_temp_path {path};" for name, path in temp.items() if name != "body"),
            f"  client_body_temp_path {temp['body']};",
            f"  include {tmp_path / 'site.conf'};",
            "}",
        ]
    )
    config = tmp_path / "nginx.conf"
    config.write_text(main + "\n", encoding="utf-8")
    check = await asyncio.create_subprocess_exec(
        binary, "-t", "-p", str(tmp_path), "-c", str(config),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(check.communicate(), START_TIMEOUT_S)
    assert check.returncode == 0, output.decode()
    # Its own main config says `daemon off` and names the error log, so the command line adds nothing.
    argv = [binary, "-p", str(tmp_path), "-c", str(config)]
    nginx = ServerProcess("nginx", argv, tmp_path / "nginx.out", other_logs=[tmp_path / "error.log"])
    base = f"http://127.0.0.1:{port}"
    async with nginx.serving(http_answers(f"{base}/healthz"), START_TIMEOUT_S, stop_within_s=STOP_TIMEOUT_S):
        yield base


async def test_listen_streams_pass_through_nginx_unbuffered_and_uncompressed(
    tmp_path: Path, fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    polling = {"min_interval_ms": 100, "default_interval_ms": 300}
    # The sidecar on loopback, as behind a local nginx: its Host guard sees what nginx sends.
    async with serve_sidecar(fast_upstream.url, polling=polling) as sidecar, _nginx(tmp_path, sidecar) as base:
        status, reply = await rpc(http, f"{base}/mcp", "resources/read", {"uri": PRICE})
        assert status == 200, reply
        assert reply["result"]["contents"][0]["text"] == "price=100"

        stream = ListenStream(http, f"{base}/mcp", "via-nginx", [PRICE])
        try:
            ack = await stream.open()
            assert ack["params"]["notifications"]["resourceSubscriptions"] == [PRICE]
            response = stream.response
            assert response.headers["Content-Type"].startswith("text/event-stream")
            assert "Content-Encoding" not in response.headers  # aiohttp sends Accept-Encoding: gzip, deflate
            # The update arrives while the stream stays open: nothing holds it back in a buffer.
            await fast_upstream.set_price(130)
            frame = await stream.next()
            assert frame["method"] == UPDATED and frame["params"]["uri"] == PRICE
        finally:
            await stream.close()

        for private in ("/metrics", "/status"):
            async with http.get(f"{base}{private}") as resp:
                assert resp.status == 404, private
        async with http.get(f"{base}/readyz") as resp:
            assert resp.status == 200
