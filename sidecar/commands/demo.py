"""`mcp-sidecar demo`: an embedded 2025-11-25 upstream whose catalog changes, with the sidecar in front of it."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from sidecar.config import load_config
from sidecar.observability.logs import configure_logging

__all__ = ["DEMO_HAS_ITS_UPSTREAM", "add_demo_command", "run_demo_command"]

DEMO_HAS_ITS_UPSTREAM = (
    "--upstream: the demo runs its own upstream (the catalog its printed commands read); to put the sidecar in "
    "front of yours: mcp-sidecar run --upstream URL|COMMAND"
)
_PLACEHOLDER_URL = "http://127.0.0.1:9/mcp"
"""The demo starts its own upstream and points the sidecar at it (run_demo); until then, this stands in."""


def add_demo_command(commands: Any) -> argparse.ArgumentParser:
    """The `demo` subcommand (`commands`: argparse's subparsers); the listener flags are added by the caller."""
    demo: argparse.ArgumentParser = commands.add_parser(
        "demo",
        help="an embedded legacy upstream with the sidecar in front, changing every few seconds",
        description="Start an embedded 2025-11-25 MCP server without subscriptions, whose catalog changes every "
        "few seconds, and the sidecar in front of it; print its URLs and curl commands to try.",
    )
    # Not offered: the demo's upstream is its own. Accepted only to say so (run takes --upstream).
    demo.add_argument("--upstream", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return demo


def run_demo_command(overrides: dict[str, dict[str, Any]]) -> int:
    """Run the demo with the listener flags' `overrides`; a bad value raises ConfigError."""
    from sidecar.demo.run import run_demo

    config = load_config(None, overrides={**overrides, "upstream": {"url": _PLACEHOLDER_URL}})
    configure_logging(config.logging.level, config.logging.format)
    return asyncio.run(run_demo(config))
