"""A small hand-written stdio MCP server (2025-11-25 only, standard library only) that misbehaves on request.

    python -m tests.peers.stdio_toy_server [--file PATH] [--garbage] [--stderr-flood N] [--ignore-sigterm]
                                           [--wrapper] [--exit-on-discover] [--pid-file PATH] [--received PATH]

Newline-delimited JSON-RPC on stdin/stdout, one message at a time: fast to start and exact about what it
writes, for the lifecycle tests. `server/discover` gets -32601 (a server of the 1.x era), unless
`--exit-on-discover` makes it exit there, as some servers do on a method they do not know.

Resources: `toy://note` (the text of --file, or "note" without one). Tools: `echo(text)`; `pid()`;
`hang()` (never answers); `freeze()` (sleeps, reading nothing more: a hung server); `big(size)` (a text
of `size` bytes); `notify()` (sends `notifications/tools/list_changed`, then answers); `sample()` (asks
the client for `sampling/createMessage` and answers with what it got back); `slow(steps)` (progress per
step).

Misbehaviour: `--garbage` writes a line that is not JSON before every answer (and a banner at start);
`--stderr-flood N` writes N lines to stderr at start; `--ignore-sigterm` survives SIGTERM and the end of
its input alike; `--wrapper`
starts the server as its own child (stdio inherited), ignores SIGTERM and forwards no signal, as a
careless launcher does; `--pid-file` appends each process's pid to a file (tests find every process);
`--received` appends every message it reads to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

_TOOLS = [
    {"name": name, "description": description, "inputSchema": {"type": "object", "properties": properties}}
    for name, description, properties in [
        ("echo", "echo the text", {"text": {"type": "string"}}),
        ("pid", "the server's process id", {}),
        ("hang", "never answers", {}),
        ("freeze", "stops the whole server (it reads nothing more)", {}),
        ("big", "a text of `size` bytes", {"size": {"type": "integer"}}),
        ("notify", "sends tools/list_changed", {}),
        ("sample", "asks its client for sampling", {}),
        ("slow", "progress per step", {"steps": {"type": "integer"}}),
    ]
]


class _Server:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = sys.stdout.buffer
        self.backlog: list[dict[str, Any]] = []
        self.next_id = 1

    def write(self, message: dict[str, Any]) -> None:
        if self.args.garbage and "id" in message and "method" not in message:
            self.out.write(b"this line is not JSON-RPC\n")
        self.out.write(json.dumps(message).encode() + b"\n")
        self.out.flush()

    def read(self) -> dict[str, Any] | None:
        if self.backlog:
            return self.backlog.pop(0)
        line = sys.stdin.buffer.readline()
        if not line:
            return None
        message: dict[str, Any] = json.loads(line)
        if self.args.received:
            with open(self.args.received, "a") as received:
                received.write(json.dumps(message) + "\n")
        return message

    def answer(self, request: dict[str, Any], result: dict[str, Any] | None = None, error: Any = None) -> None:
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request["id"]}
        if error is not None:
            reply["error"] = error
        else:
            reply["result"] = result if result is not None else {}
        self.write(reply)

    def serve(self) -> None:
        while (message := self.read()) is not None:
            if "method" not in message or "id" not in message:
                continue  # notifications (initialized, cancelled) and stray answers
            self.handle(message)
        while self.args.ignore_sigterm:  # stubborn: not even the end of its input ends it
            time.sleep(3600)

    def handle(self, request: dict[str, Any]) -> None:
        method = request["method"]
        params = request.get("params") or {}
        if method == "server/discover" and self.args.exit_on_discover:
            sys.exit(3)
        if method == "initialize":
            self.answer(
                request,
                {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {"tools": {"listChanged": True}, "resources": {}},
                    "serverInfo": {"name": "stdio-toy", "version": "1"},
                },
            )
        elif method == "ping":
            self.answer(request)
        elif method == "tools/list":
            self.answer(request, {"tools": _TOOLS})
        elif method == "resources/list":
            self.answer(request, {"resources": [{"uri": "toy://note", "name": "note", "mimeType": "text/plain"}]})
        elif method == "resources/read" and params.get("uri") == "toy://note":
            text = Path(self.args.file).read_text() if self.args.file else "note"
            self.answer(request, {"contents": [{"uri": "toy://note", "mimeType": "text/plain", "text": text}]})
        elif method == "resources/read":
            self.answer(request, error={"code": -32002, "message": "Resource not found"})
        elif method == "tools/call":
            self.call_tool(request, params.get("name"), params.get("arguments") or {}, params.get("_meta") or {})
        else:
            self.answer(request, error={"code": -32601, "message": "Method not found"})

    def call_tool(self, request: dict[str, Any], name: Any, arguments: dict[str, Any], meta: dict[str, Any]) -> None:
        def text(value: str) -> dict[str, Any]:
            return {"content": [{"type": "text", "text": value}]}

        if name == "echo":
            self.answer(request, text(str(arguments.get("text", ""))))
        elif name == "pid":
            self.answer(request, text(str(os.getpid())))
        elif name == "hang":
            return
        elif name == "freeze":
            time.sleep(3600)
        elif name == "big":
            self.answer(request, text("x" * int(arguments.get("size", 0))))
        elif name == "notify":
            self.write({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
            self.answer(request, text("notified"))
        elif name == "sample":
            self.answer(request, text(json.dumps(self.ask("sampling/createMessage", {"messages": [], "maxTokens": 1}))))
        elif name == "slow":
            steps = int(arguments.get("steps", 1))
            for step in range(1, steps + 1):
                if "progressToken" in meta:
                    progress = {"progressToken": meta["progressToken"], "progress": step, "total": steps}
                    self.write({"jsonrpc": "2.0", "method": "notifications/progress", "params": progress})
            self.answer(request, text(f"done after {steps} steps"))
        else:
            self.answer(request, error={"code": -32602, "message": f"Unknown tool: {name}"})

    def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """A request to the client; what it answers (requests arriving meanwhile wait in the backlog)."""
        request_id = f"toy-{self.next_id}"
        self.next_id += 1
        self.write({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        while True:
            line = sys.stdin.buffer.readline()
            if not line:
                sys.exit(0)
            message = json.loads(line)
            if message.get("id") == request_id and "method" not in message:
                return {key: message[key] for key in ("result", "error") if key in message}
            self.backlog.append(message)


def _wrap(argv: list[str]) -> int:
    # A careless launcher: the server is its child, SIGTERM is ignored here and never forwarded.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    inner = [arg for arg in argv if arg != "--wrapper"]
    child = subprocess.Popen([sys.executable, "-m", "tests.peers.stdio_toy_server", *inner])
    return child.wait()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="tests: a small stdio MCP server that misbehaves on request")
    parser.add_argument("--file")
    parser.add_argument("--garbage", action="store_true")
    parser.add_argument("--stderr-flood", type=int, default=0)
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--wrapper", action="store_true")
    parser.add_argument("--exit-on-discover", action="store_true")
    parser.add_argument("--pid-file")
    parser.add_argument("--received", help="append every message read to this file (JSON lines)")
    args = parser.parse_args(argv)
    if args.pid_file:
        with open(args.pid_file, "a") as pids:
            pids.write(f"{os.getpid()}\n")
    if args.wrapper:
        sys.exit(_wrap(argv))
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.garbage:
        sys.stdout.buffer.write(b"toy server starting (a banner on stdout, as careless servers print)\n")
        sys.stdout.buffer.flush()
    for number in range(args.stderr_flood):
        sys.stderr.write(f"stderr flood line {number}\n")
    sys.stderr.flush()
    _Server(args).serve()


if __name__ == "__main__":
    main()
