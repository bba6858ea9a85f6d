"""`mcp-sidecar hint`: tell a running sidecar what changed at its source (`POST /hints`), one line of outcome."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sidecar.hints.client import DEFAULT_ADMIN_URL, send_hint
from sidecar.protocol import LIST_KIND_OF_PRIMITIVE

__all__ = ["add_hint_command", "run_hint"]


def add_hint_command(commands: Any) -> None:
    """The `hint` subcommand and its options (`commands`: argparse's subparsers)."""
    hint = commands.add_parser(
        "hint",
        help="tell a running sidecar that something changed at the source (POST /hints)",
        description="Tell a running sidecar that resources changed at the source: each watched URI that matches "
        "(exactly, or a glob where * matches any run of characters) is looked at now, in every context, with its "
        "own credential; clients are told only if the content did change. Needs hints.token_file on the sidecar.",
    )
    hint.add_argument("uris", nargs="*", metavar="URI", help="a resource URI, or a glob such as 'catalog://plans/*'")
    hint.add_argument(
        "--list",
        dest="lists",
        action="append",
        default=[],
        choices=list(LIST_KIND_OF_PRIMITIVE),
        help="a list that changed too (its watches look again); repeatable",
    )
    hint.add_argument(
        "--admin-url",
        default=DEFAULT_ADMIN_URL,
        metavar="URL",
        help=f"the sidecar's admin listener (default {DEFAULT_ADMIN_URL}; https:// when admin.tls is set)",
    )
    hint.add_argument(
        "--token-file", required=True, metavar="FILE", help="the file holding the token (as hints.token_file)"
    )
    hint.add_argument("--ca-file", metavar="FILE", help="CA bundle to verify an HTTPS admin listener with")


def run_hint(args: argparse.Namespace) -> int:
    if not args.uris and not args.lists:
        print("mcp-sidecar hint: name at least one URI or --list", file=sys.stderr)
        return 2
    if not args.admin_url.startswith(("http://", "https://")):
        print(f"mcp-sidecar hint: --admin-url: {args.admin_url!r} is not an http:// or https:// URL", file=sys.stderr)
        return 2
    try:
        code, line = send_hint(args.admin_url, args.token_file, args.uris, args.lists, args.ca_file)
    except ValueError as exc:
        print(f"mcp-sidecar hint: --token-file: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"mcp-sidecar hint: cannot reach {args.admin_url}: {getattr(exc, 'reason', exc)}", file=sys.stderr)
        return 1
    print(line if code == 0 else f"mcp-sidecar hint: {line}", file=sys.stdout if code == 0 else sys.stderr)
    return code
