"""`mcp-sidecar demo`: the embedded legacy upstream with the sidecar in front of it, until Ctrl-C."""

from __future__ import annotations

import logging

from aiohttp import web

from sidecar.app import ADMIN, HUB, build_app
from sidecar.config import SidecarConfig
from sidecar.demo.snippet import sdk_snippet
from sidecar.demo.upstream import DemoUpstream
from sidecar.protocol import MODERN_VERSION
from sidecar.serving import stop_signals

__all__ = ["run_demo"]

logger = logging.getLogger(__name__)

DEMO_URI = "catalog://plans/basic"
"""The resource whose price the demo upstream changes every few seconds; every command the demo prints watches it."""
SNIPPET_FILE = "watch.py"
_DEMO_POLL_INTERVAL_MS = 1_000  # the demo upstream sends no ttlMs; poll every second so changes show quickly

_CURL = (
    "curl -N {url} -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' "
    "-H 'MCP-Protocol-Version: {version}' -H 'Mcp-Method: subscriptions/listen' -d '"
    '{{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{{"_meta":{{'
    '"io.modelcontextprotocol/protocolVersion":"{version}","io.modelcontextprotocol/clientCapabilities":{{}}}},'
    '"notifications":{{"resourceSubscriptions":["{uri}"],"toolsListChanged":true}}}}}}'
    "'"
)
_CURL_READ = (
    "curl -s {url} -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' "
    "-H 'MCP-Protocol-Version: {version}' -H 'Mcp-Method: resources/read' -H 'Mcp-Name: {uri}' -d '"
    '{{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{{"_meta":{{'
    '"io.modelcontextprotocol/protocolVersion":"{version}","io.modelcontextprotocol/clientCapabilities":{{}}}},'
    '"uri":"{uri}"}}}}'
    "'"
)


async def run_demo(config: SidecarConfig) -> int:
    # The admin listener on a free port unless one was asked for (--admin-port, MCP_SIDECAR__ADMIN__PORT): a
    # demo beside a running sidecar must not fail on the admin port the sidecar holds.
    admin_port = config.admin.port if "port" in config.admin.model_fields_set else 0
    upstream = DemoUpstream()
    await upstream.start("127.0.0.1", 0)
    config = config.with_overrides(
        {
            "upstream": {"url": upstream.url},
            "polling": {"default_interval_ms": _DEMO_POLL_INTERVAL_MS},
            "admin": {"port": admin_port},
        }
    )
    app = build_app(config)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=2, access_log=None)
    admin_runner = web.AppRunner(app[ADMIN], shutdown_timeout=2, access_log=None)
    await runner.setup()
    await admin_runner.setup()
    try:
        for flag, site_runner, host, port in (
            ("--port", runner, config.listen.host, config.listen.port),
            ("--admin-port", admin_runner, config.admin.host, config.admin.port),
        ):
            try:
                await web.TCPSite(site_runner, host, port).start()
            except OSError as exc:
                print(f"mcp-sidecar demo: cannot listen on {host}:{port}: {exc.strerror}")
                print(f"try: mcp-sidecar demo {flag} 0")
                return 1
        url = _url(runner, config.listen.path)
        admin = _url(admin_runner, "")
        addresses = (
            ("demo upstream (2025-11-25, no subscriptions):", upstream.url),
            ("mcp-sidecar (2026-07-28, subscriptions):", url),
            ("its status (upstream, watches, clients):", f"{admin}/status"),
            ("its Prometheus metrics:", f"{admin}{config.metrics.path}"),
        )
        width = max(len(label) for label, _ in addresses)
        for label, address in addresses:
            print(f"{label:<{width}} {address}", flush=True)
        print("\nListen for changes (the basic plan's price changes every few seconds):\n", flush=True)
        print(_CURL.format(url=url, version=MODERN_VERSION, uri=DEMO_URI), flush=True)
        print("\nAnd in another terminal, re-read it after each notification:\n", flush=True)
        print(_CURL_READ.format(url=url, version=MODERN_VERSION, uri=DEMO_URI), flush=True)
        print(f'\nOr with the official Python SDK (pip install "mcp>=2.3"), as {SNIPPET_FILE}:\n', flush=True)
        print(sdk_snippet(url, DEMO_URI), flush=True)
        print("\nCtrl-C to stop.", flush=True)
        with stop_signals() as stop:
            await stop.wait()
        logger.info("mcp-sidecar demo stopping", extra={"streams": app[HUB].stream_count})
    finally:
        await runner.cleanup()
        await admin_runner.cleanup()
        await upstream.aclose()
    logger.info("mcp-sidecar demo stopped")
    return 0


def _url(runner: web.AppRunner, path: str) -> str:
    host, port = runner.addresses[0][:2]
    url_host = f"[{host}]" if ":" in host else host  # an IPv6 address needs brackets in a URL
    return f"http://{url_host}:{port}{path}"
