"""The `mcp-sidecar` command line: its parser, and `main`, which runs the command it names (run, check-config, demo,
hint, health; each in `sidecar/commands/`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from sidecar import __version__
from sidecar.commands.check_config import add_check_config_command, check_config
from sidecar.commands.demo import DEMO_HAS_ITS_UPSTREAM, add_demo_command, run_demo_command
from sidecar.commands.health import add_health_command, run_health
from sidecar.commands.hint import add_hint_command, run_hint
from sidecar.commands.serve import WORKER_ENV, run_workers, serve_settled
from sidecar.config import ConfigError, SidecarConfig, load_config
from sidecar.observability.logs import configure_logging

__all__ = ["CONFIG_ENV", "main"]

logger = logging.getLogger(__name__)

CONFIG_ENV = "MCP_SIDECAR_CONFIG"
"""The config file of `run` and `health` when no --config names one: a container image sets it once, and its
HEALTHCHECK reads the same file as the sidecar it asks."""

_DESCRIPTION = "mcp-sidecar: a reverse proxy that gives MCP resource subscriptions to MCP servers without them."
_EXAMPLES = """\
examples:
  mcp-sidecar run --upstream http://127.0.0.1:9000/mcp   in front of an MCP server over HTTP, on :8080/mcp
  mcp-sidecar run --upstream 'uvx mcp-server-time'       in front of a stdio server it starts itself
  mcp-sidecar run --config sidecar.yaml                  every setting from a file (config/sidecar.example.yaml)
  mcp-sidecar demo                                       an embedded server whose catalog changes, to try it on
  mcp-sidecar hint 'catalog://plans/*' --token-file F    tell a running sidecar what changed at its source
  mcp-sidecar health --config sidecar.yaml               exit 0 if the sidecar that file configures answers /healthz

`mcp-sidecar COMMAND --help` lists a command's options. Any setting can also come from the environment:
MCP_SIDECAR__SECTION__KEY=value (MCP_SIDECAR__ADMIN__PORT=9465); flags win over the environment, which wins over
the file. MCP_SIDECAR_CONFIG=FILE stands for --config FILE."""
_UPSTREAM_HELP = (
    "the upstream: a value starting with http:// or https:// is its MCP URL (upstream.url); anything else is a "
    "stdio MCP server to start, split into program and arguments as a shell would, without running a shell "
    "(upstream.command), e.g. --upstream 'uvx mcp-server-time'"
)
_LISTENER_FLAGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--host", {"metavar": "ADDRESS", "help": "address MCP clients connect to (listen.host; default 127.0.0.1)"}),
    ("--port", {"type": int, "help": "port MCP clients connect to (listen.port; default 8080; 0 picks a free one)"}),
    (
        "--admin-host",
        {"metavar": "ADDRESS", "help": "address of /metrics, /status, /readyz (admin.host; default 127.0.0.1)"},
    ),
    (
        "--admin-port",
        {
            "type": int,
            "metavar": "PORT",
            "help": "port of the admin listener (admin.port; run: default 9464, demo: a free one); give each "
            "sidecar on one host its own, or 0 for a free one",
        },
    ),
    (
        "--log-level",
        {"choices": ["debug", "info", "warning", "error"], "help": "the least severe level logged (logging.level)"},
    ),
    (
        "--log-format",
        {
            "choices": ["auto", "json", "text"],
            "help": "logs on stderr: text lines for a person, JSON lines for a collector; auto (the default) picks "
            "text when stderr is a terminal (logging.format)",
        },
    ),
)
"""Options of run and demo, also accepted before the command (`mcp-sidecar --port 9000 run`)."""
_ADDRESS_FLAGS = ("--host", "--port", "--admin-host", "--admin-port")
"""The ones `health` takes too: where the listeners are."""
_UPSTREAM_ENV_HELP = (
    "for a stdio upstream: NAME passes the variable NAME of this environment to the command "
    "(upstream.inherit_env); NAME=VALUE sets it (upstream.env). Repeatable. The proxy and CA variables "
    "(HTTPS_PROXY, SSL_CERT_FILE, ...) pass without it"
)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mcp-sidecar",
        description=_DESCRIPTION,
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mcp-sidecar {__version__}")
    parser.add_argument("--config", metavar="FILE", help="YAML config file (shorthand for `run --config FILE`)")
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="run the sidecar in the foreground until SIGTERM or Ctrl-C",
        description="Run the sidecar in the foreground until SIGTERM or Ctrl-C. Flags override the config file, "
        "which overrides the defaults.",
    )
    run.add_argument("--config", dest="run_config", metavar="FILE", help=f"YAML config file (default: ${CONFIG_ENV})")
    run.add_argument(
        "--workers", type=int, default=1, help="processes sharing the port (SO_REUSEPORT); >1 needs bus.backend: redis"
    )
    run.add_argument(
        "--upstream-env",
        action="append",
        type=_env_setting,
        default=[],
        metavar="NAME[=VALUE]",
        help=_UPSTREAM_ENV_HELP,
    )
    add_check_config_command(sub)
    demo = add_demo_command(sub)
    add_hint_command(sub)
    health = add_health_command(sub)
    for command in (parser, run):
        upstream_default = _default(command, parser)
        command.add_argument("--upstream", default=upstream_default, metavar="URL|COMMAND", help=_UPSTREAM_HELP)
    for command in (parser, run, demo):
        for flag, options in _LISTENER_FLAGS:
            command.add_argument(flag, default=_default(command, parser), **options)
    for flag, options in _LISTENER_FLAGS:
        if flag in _ADDRESS_FLAGS:
            health.add_argument(flag, default=argparse.SUPPRESS, **options)
    return parser


def _default(command: argparse.ArgumentParser, parser: argparse.ArgumentParser) -> object:
    # A subcommand's own default would overwrite the same flag given before it (`--port 9 run`).
    return None if command is parser else argparse.SUPPRESS


def _env_setting(text: str) -> tuple[str, str | None]:
    name, equals, value = text.partition("=")
    if not _ENV_NAME.fullmatch(name):
        raise argparse.ArgumentTypeError(f"{name!r} is not an environment variable name (expected NAME or NAME=VALUE)")
    return name, value if equals else None


def _with_upstream_env(config: SidecarConfig, settings: Sequence[tuple[str, str | None]]) -> SidecarConfig:
    """`--upstream-env` added to what the file and the environment gave: names to inherit, and values to set."""
    if not settings:
        return config
    upstream = config.upstream
    env = {name: value.get_secret_value() for name, value in upstream.env.items()}
    env.update({name: value for name, value in settings if value is not None})
    inherit = [*upstream.inherit_env, *(name for name, value in settings if value is None)]
    return config.with_overrides({"upstream": {"env": env, "inherit_env": list(dict.fromkeys(inherit))}})


def _flag_overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    overrides: dict[str, dict[str, Any]] = {}
    if getattr(args, "upstream", None):
        target = "url" if args.upstream.startswith(("http://", "https://")) else "command"
        overrides.setdefault("upstream", {})[target] = args.upstream
    for flag, section, key in _FLAG_KEYS:
        value = getattr(args, flag, None)
        if value is not None and value != "":
            overrides.setdefault(section, {})[key] = value
    return overrides


_FLAG_KEYS = (
    ("host", "listen", "host"),
    ("port", "listen", "port"),
    ("admin_host", "admin", "host"),
    ("admin_port", "admin", "port"),
    ("log_level", "logging", "level"),
    ("log_format", "logging", "format"),
)
"""Each flag's argparse name, and the configuration key it sets."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None and args.config is None and args.upstream is None:
        # Nothing says what to run: the usage, not the configuration error a bare `run` would give.
        parser.print_help(sys.stderr)
        return 2
    if args.command == "demo" and args.upstream is not None:
        print(f"mcp-sidecar demo: {DEMO_HAS_ITS_UPSTREAM}", file=sys.stderr)
        return 2
    if args.command == "hint":
        return run_hint(args)
    path = getattr(args, "run_config", None) or args.config or os.environ.get(CONFIG_ENV) or None
    if args.command == "health":
        return run_health(args, path, _flag_overrides(args))
    try:
        if args.command == "check-config":
            return check_config(args)
        if args.command == "demo":
            return run_demo_command(_flag_overrides(args))
        config = _with_upstream_env(
            load_config(path, overrides=_flag_overrides(args)), getattr(args, "upstream_env", [])
        )
        workers = getattr(args, "workers", 1)
        _check_workers(config, workers)
        loop_factory = _loop_factory(config.listen.event_loop)
    except ConfigError as exc:
        for problem in str(exc).splitlines():  # one line per bad key: `mcp-sidecar: key: problem`
            print(f"mcp-sidecar: {problem}", file=sys.stderr)
        return 1
    configure_logging(config.logging.level, config.logging.format)
    if workers > 1 and os.environ.get(WORKER_ENV) is None:
        return run_workers(workers, argv if argv is not None else sys.argv[1:])
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(serve_settled(config, reuse_port=workers > 1))


def _loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when `listen.event_loop` asks for it, and by default on Linux when it is installed; None is
    asyncio's own. Why: the same code forwards about a sixth more requests a second on it (bench/PROFILE.md)."""
    if choice == "asyncio" or (choice == "auto" and not sys.platform.startswith("linux")):
        return None
    try:
        import uvloop
    except ImportError as exc:
        if choice == "uvloop":
            raise ConfigError("listen.event_loop: uvloop is not installed (pip install uvloop)") from exc
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _check_workers(config: SidecarConfig, workers: int) -> None:
    if workers < 1:
        raise ConfigError("--workers: must be at least 1")
    if workers > 1 and config.bus.backend != "redis":
        raise ConfigError(
            f"bus.backend: --workers {workers} needs bus.backend: redis (each worker is its own process; "
            "without a shared bus a change seen by one would not reach the streams of another)"
        )
    if workers > 1 and config.listen.port == 0:
        raise ConfigError("listen.port: --workers needs a fixed port for the workers to share")


if __name__ == "__main__":
    sys.exit(main())
