"""`mcp-sidecar demo`: the embedded legacy upstream with the sidecar in front of it, until Ctrl-C."""

from __future__ import annotations

import logging

from aiohttp import web

from sidecar.app import build_app
from sidecar.config import SidecarConfig
from sidecar.demo.upstream import DemoUpstream
from sidecar.protocol.constants import MODERN_VERSION
from sidecar.serving import stop_signals

__all__ = ["run_demo"]

logger = logging.getLogger(__name__)

_DEMO_POLL_INTERVAL_MS = 1_000  # the demo upstream sends no ttlMs; poll every second so changes show quickly

_CURL = (
    "curl -N {url} -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' "
    "-H 'MCP-Protocol-Version: {version}' -H 'Mcp-Method: subscriptions/listen' -d '"
    '{{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{{"_meta":{{'
    '"io.modelcontextprotocol/protocolVersion":"{version}","io.modelcontextprotocol/clientCapabilities":{{}}}},'
    '"notifications":{{"resourceSubscriptions":["catalog://plans/basic"],"toolsListChanged":true}}}}}}'
    "'"
)
_CURL_READ = (
    "curl -s {url} -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' "
    "-H 'MCP-Protocol-Version: {version}' -H 'Mcp-Method: resources/read' -H 'Mcp-Name: catalog://plans/basic' -d '"
    '{{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{{"_meta":{{'
    '"io.modelcontextprotocol/protocolVersion":"{version}","io.modelcontextprotocol/clientCapabilities":{{}}}},'
    '"uri":"catalog://plans/basic"}}}}'
    "'"
)


async def run_demo(config: SidecarConfig) -> int:
    upstream = DemoUpstream()
    await upstream.start("127.0.0.1", 0)
    config = config.with_overrides(
        {"upstream": {"url": upstream.url}, "polling": {"default_interval_ms": _DEMO_POLL_INTERVAL_MS}}
    )
    runner = web.AppRunner(build_app(config), handler_cancellation=True, shutdown_timeout=2, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.listen.host, config.listen.port)
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        await upstream.aclose()
        print(f"mcp-sidecar demo: cannot listen on {config.listen.host}:{config.listen.port}: {exc.strerror}")
        print("try: mcp-sidecar demo --port 0")
        return 1
    host, port = runner.addresses[0][:2]
    url_host = f"[{host}]" if ":" in host else host  # an IPv6 address needs brackets in a URL
    url = f"http://{url_host}:{port}{config.listen.path}"
    print(f"demo upstream (2025-11-25, no subscriptions): {upstream.url}", flush=True)
    print(f"mcp-sidecar (2026-07-28, subscriptions):    {url}", flush=True)
    print("\nListen for changes (the basic plan's price changes every few seconds):\n", flush=True)
    print(_CURL.format(url=url, version=MODERN_VERSION), flush=True)
    print("\nAnd in another terminal, re-read it after each notification:\n", flush=True)
    print(_CURL_READ.format(url=url, version=MODERN_VERSION), flush=True)
    print("\nCtrl-C to stop.", flush=True)
    try:
        with stop_signals() as stop:
            await stop.wait()
    finally:
        await runner.cleanup()
        await upstream.aclose()
    return 0
