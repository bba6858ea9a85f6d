"""A launcher in front of a stdio MCP server, as `uvx` or `npx` is: it must reach a registry before it runs it.

    python -m tests.peers.stdio_launcher [--require NAME]... [--fail-first MARKER] -- COMMAND [ARG]...

`--require NAME`: the launcher cannot reach its registry without the variable NAME (a proxy, a CA bundle,
an index URL): when any is unset it says so on stderr, as a failed download does, and exits 2.
`--fail-first MARKER`: the first start (no file at MARKER yet) fails as a failed download does: it
creates MARKER, writes to stderr and exits 1, having read nothing on stdin. Otherwise it execs COMMAND
(the server gets the launcher's stdin, stdout and environment, and its process).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

__all__ = ["main"]


def main() -> None:
    parser = argparse.ArgumentParser(prog="stdio_launcher")
    parser.add_argument("--require", action="append", default=[], metavar="NAME")
    parser.add_argument("--fail-first", type=Path, metavar="MARKER")
    parser.add_argument("command", nargs="+")
    args = parser.parse_args()
    missing = [name for name in args.require if not os.environ.get(name)]
    if missing:
        print("launcher: resolving the server package", file=sys.stderr)
        print(f"launcher: error: cannot reach the registry: {', '.join(missing)} not set", file=sys.stderr)
        sys.exit(2)
    if args.fail_first is not None and not args.fail_first.exists():
        args.fail_first.touch()
        print("launcher: error: download failed: connection reset by peer", file=sys.stderr)
        sys.exit(1)
    sys.stderr.flush()
    os.execvp(args.command[0], args.command)


if __name__ == "__main__":
    main()
