"""`mcp-sidecar check-config FILE`: validate a config file and print the effective configuration."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from sidecar.config import load_config
from sidecar.config.shown import shown_config

__all__ = ["add_check_config_command", "check_config"]


def add_check_config_command(commands: Any) -> None:
    """The `check-config` subcommand (`commands`: argparse's subparsers)."""
    check = commands.add_parser(
        "check-config",
        help="validate a config file and print the effective config",
        description="Validate a config file (with the MCP_SIDECAR__ environment overrides) and print the "
        "effective configuration as JSON, secrets masked; exits 1 naming each bad key.",
    )
    check.add_argument("file", help="the YAML config file to check")


def check_config(args: argparse.Namespace) -> int:
    """Print the effective configuration as JSON, secrets masked; a bad key raises ConfigError."""
    config = load_config(args.file)
    for warning in config.warnings():
        print(f"mcp-sidecar: warning: {warning}", file=sys.stderr)
    return _print(json.dumps(shown_config(config), indent=2))


def _print(text: str) -> int:
    """Print to stdout; a reader that stops early (`check-config ... | head`) is no error."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # Python's own recipe: point stdout at devnull so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
