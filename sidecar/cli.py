"""The `mcp-sidecar` command: run, check-config, demo, hint."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from aiohttp import web

from sidecar import __version__
from sidecar.app import ADMIN, HINT_TOKEN, METRICS, UPSTREAM, build_app
from sidecar.bus.redis import RedisUnavailable
from sidecar.config import ConfigError, SidecarConfig, load_config
from sidecar.config.shown import shown_config
from sidecar.hints.client import DEFAULT_ADMIN_URL, send_hint
from sidecar.observability.logs import INSTANCE_ENV, configure_logging, log_configuration
from sidecar.observability.tracing import TracingUnavailable, configure_tracing, install, tracing
from sidecar.serving import GuardedRunner, install_quiet_errors, raise_open_files_limit, settle_heap, stop_signals
from sidecar.tls import CertificateWatch, server_context
from sidecar.upstream.http.client import UpstreamClient
from sidecar.upstream.stdio.process import StdioStartError

__all__ = ["main", "run_workers", "serve"]

logger = logging.getLogger(__name__)

_WORKER_ENV = "MCP_SIDECAR_WORKER"
_FILES_BESIDES_CLIENTS = 1024
"""Open files the sidecar needs besides client connections: upstream pool, Redis, logs, the admin listener."""
_ADMIN_CONNECTIONS = 64
_CERTIFICATE_CHECK_S = 10.0
"""How often the certificate files in use are looked at for a change."""
"""Scrapers and probes: a handful of connections; more is a client that should not be there."""
_DEMO_PLACEHOLDER_URL = "http://127.0.0.1:9/mcp"
"""The demo starts its own upstream and points the sidecar at it (run_demo); until then, this stands in."""
_DESCRIPTION = "mcp-sidecar: a reverse proxy that gives MCP resource subscriptions to MCP servers without them."
_EXAMPLES = """\
examples:
  mcp-sidecar run --upstream http://127.0.0.1:9000/mcp   in front of an MCP server over HTTP, on :8080/mcp
  mcp-sidecar run --upstream 'uvx mcp-server-time'       in front of a stdio server it starts itself
  mcp-sidecar run --config sidecar.yaml                  every setting from a file (config/sidecar.example.yaml)
  mcp-sidecar demo                                       an embedded server whose catalog changes, to try it on
  mcp-sidecar hint 'catalog://plans/*' --token-file F    tell a running sidecar what changed at its source

`mcp-sidecar COMMAND --help` lists a command's options. Any setting can also come from the environment:
MCP_SIDECAR__SECTION__KEY=value (MCP_SIDECAR__ADMIN__PORT=9465)."""
_UPSTREAM_HELP = (
    "the upstream: a value starting with http:// or https:// is its MCP URL (upstream.url); anything else is a "
    "stdio MCP server to start, split into program and arguments as a shell would, without running a shell "
    "(upstream.command), e.g. --upstream 'uvx mcp-server-time'"
)
_DEMO_HAS_ITS_UPSTREAM = (
    "--upstream: the demo runs its own upstream (the catalog its printed commands read); to put the sidecar in "
    "front of yours: mcp-sidecar run --upstream URL|COMMAND"
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
    run.add_argument("--config", dest="run_config", metavar="FILE", help="YAML config file")
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
    check = sub.add_parser(
        "check-config",
        help="validate a config file and print the effective config",
        description="Validate a config file (with the MCP_SIDECAR__ environment overrides) and print the "
        "effective configuration as JSON, secrets masked; exits 1 naming each bad key.",
    )
    check.add_argument("file", help="the YAML config file to check")
    demo = sub.add_parser(
        "demo",
        help="an embedded legacy upstream with the sidecar in front, changing every few seconds",
        description="Start an embedded 2025-11-25 MCP server without subscriptions, whose catalog changes every "
        "few seconds, and the sidecar in front of it; print its URLs and curl commands to try.",
    )
    hint = sub.add_parser(
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
        choices=["tools", "prompts", "resources"],
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
    # Not offered: the demo's upstream is its own. Accepted only to say so (run takes --upstream).
    demo.add_argument("--upstream", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    for command in (parser, run):
        upstream_default = _default(command, parser)
        command.add_argument("--upstream", default=upstream_default, metavar="URL|COMMAND", help=_UPSTREAM_HELP)
    for command in (parser, run, demo):
        for flag, options in _LISTENER_FLAGS:
            command.add_argument(flag, default=_default(command, parser), **options)
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
        print(f"mcp-sidecar demo: {_DEMO_HAS_ITS_UPSTREAM}", file=sys.stderr)
        return 2
    if args.command == "hint":
        return _hint(args)
    try:
        if args.command == "check-config":
            config = load_config(args.file)
            for warning in config.upstream.identity_warnings():
                print(f"mcp-sidecar: warning: {warning}", file=sys.stderr)
            return _print(json.dumps(shown_config(config), indent=2))
        if args.command == "demo":
            from sidecar.demo.run import run_demo

            overrides = {**_flag_overrides(args), "upstream": {"url": _DEMO_PLACEHOLDER_URL}}
            config = load_config(None, overrides=overrides)
            configure_logging(config.logging.level, config.logging.format)
            return asyncio.run(run_demo(config))
        path = getattr(args, "run_config", None) or args.config
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
    if workers > 1 and os.environ.get(_WORKER_ENV) is None:
        return run_workers(workers, argv if argv is not None else sys.argv[1:])
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(_serve_settled(config, reuse_port=workers > 1))


def _hint(args: argparse.Namespace) -> int:
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


async def _serve_settled(config: SidecarConfig, *, reuse_port: bool) -> int:
    # The process's own heap only: `serve` also runs inside test processes, whose heap is not the sidecar's.
    ready = asyncio.Event()

    async def settle() -> None:
        await ready.wait()
        settle_heap()

    settling = asyncio.get_running_loop().create_task(settle())
    try:
        return await serve(config, ready, reuse_port=reuse_port)
    except Exception as exc:
        if ready.is_set():
            raise
        # What the configuration check cannot know (a file changed since, a resource of the host): one line, the
        # traceback only for whoever asked for debug logs.
        logger.debug("start-up failed", exc_info=True)
        print(f"mcp-sidecar: start-up: {exc or type(exc).__name__} (--log-level debug shows where)", file=sys.stderr)
        return 1
    finally:
        settling.cancel()


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


def _print(text: str) -> int:
    """Print to stdout; a reader that stops early (`check-config ... | head`) is no error."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # Python's own recipe: point stdout at devnull so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


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


def run_workers(count: int, argv: Sequence[str]) -> int:
    """Start `count` worker processes on one port and forward SIGTERM/SIGINT (stop) and SIGHUP (read the
    certificate files again) to them until all exit."""
    env = {**os.environ, _WORKER_ENV: "1"}
    command = [sys.executable, "-m", "sidecar.cli", *argv]
    named = os.environ.get(INSTANCE_ENV)  # each worker is a replica of its own: a name of its own too
    children = [
        subprocess.Popen(command, env={**env, INSTANCE_ENV: f"{named}-{n}"} if named else env) for n in range(count)
    ]

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGHUP, forward)  # its default action would end this process, and the workers with it
    codes = [child.wait() for child in children]
    return max(codes, default=0)


async def serve(config: SidecarConfig, ready: asyncio.Event | None = None, *, reuse_port: bool = False) -> int:
    """Serve until SIGTERM or SIGINT, then shut down in order: streams end, requests drain, parts close."""
    loop = asyncio.get_running_loop()
    install_quiet_errors(loop)
    try:
        traced = configure_tracing(config.tracing)
    except TracingUnavailable as exc:
        print(f"mcp-sidecar: tracing: {exc}", file=sys.stderr)
        return 1
    if traced is not None:
        install(traced)
    try:
        return await _serve(config, ready, reuse_port=reuse_port)
    finally:
        tracing().shutdown()  # what is buffered goes to the collector before the exit


async def _serve(config: SidecarConfig, ready: asyncio.Event | None, *, reuse_port: bool) -> int:
    loop = asyncio.get_running_loop()
    config = config.model_copy(update={"listen": raise_open_files_limit(config.listen, _FILES_BESIDES_CLIENTS)})
    app = build_app(config)
    metrics = app[METRICS]
    runner = GuardedRunner(
        app,
        config.listen,
        metrics,
        handler_cancellation=True,
        shutdown_timeout=config.listen.shutdown_grace_s,
        access_log=None,
    )
    admin_runner = GuardedRunner(
        app[ADMIN], config.listen.model_copy(update={"max_connections": _ADMIN_CONNECTIONS}), metrics, access_log=None
    )
    try:
        await runner.setup()
    except RedisUnavailable as exc:
        print(f"mcp-sidecar: {exc} (set bus.fallback: local to start without it)", file=sys.stderr)
        await runner.cleanup()
        return 1
    except StdioStartError as exc:
        print(f"mcp-sidecar: upstream.command: {exc}", file=sys.stderr)
        await runner.cleanup()
        return 1
    await admin_runner.setup()
    certificates = CertificateWatch()
    upstream = app[UPSTREAM]
    if isinstance(upstream, UpstreamClient) and config.upstream.url.startswith("https://"):
        certificates.upstream(config.upstream.tls, upstream.use_tls)
    for name, site_runner, host, port, tls in (
        ("listen", runner, config.listen.host, config.listen.port, config.listen.tls),
        ("admin", admin_runner, config.admin.host, config.admin.port, config.admin.tls),
    ):
        try:
            context = server_context(tls)
        except (OSError, ssl.SSLError, ValueError) as exc:
            await admin_runner.cleanup()
            await runner.cleanup()
            print(f"mcp-sidecar: {name}.tls: cannot load the certificate files: {exc}", file=sys.stderr)
            return 1
        if context is not None:
            certificates.listener(name, context, tls)
        try:
            site = web.TCPSite(
                site_runner,
                host,
                port,
                reuse_port=reuse_port or None,
                backlog=config.listen.backlog,
                ssl_context=context,
            )
            await site.start()
        except OSError as exc:
            await admin_runner.cleanup()
            await runner.cleanup()
            print(f"mcp-sidecar: {name}: cannot listen on {host}:{port}: {exc.strerror}", file=sys.stderr)
            return 1
    watcher = loop.create_task(_watch_certificates(certificates)) if certificates.watching else None
    try:
        # The handlers go in before the line that says the sidecar listens: a supervisor that sends SIGTERM as
        # soon as it reads that line gets a clean shutdown, not the default action's death.
        hint_token = app.get(HINT_TOKEN)
        reloads = [certificates.reload] + ([hint_token.reload] if hint_token is not None else [])
        with stop_signals() as stop, _reload_on_sighup(reloads):
            log_configuration(config)  # secrets masked: never a token, a header value or a password
            for warning in config.upstream.identity_warnings():
                logger.warning(warning)
            logger.info(
                "mcp-sidecar listening",
                extra={
                    "event_loop": type(loop).__module__.split(".")[0],  # uvloop or asyncio
                    "url": _url(runner, config.listen.path, config.listen.tls.enabled),
                    "admin": _url(admin_runner, config.metrics.path, config.admin.tls.enabled),
                    "upstream": config.upstream.display_url,
                },
            )
            if ready is not None:
                ready.set()
            await stop.wait()
    finally:
        if watcher is not None:
            watcher.cancel()
        logger.info("shutting down")
        await runner.cleanup()
        await admin_runner.cleanup()
    return 0


def _url(runner: web.AppRunner, path: str, tls: bool = False) -> str:
    host, port = runner.addresses[0][:2]
    url_host = f"[{host}]" if ":" in host else host  # an IPv6 address needs brackets in a URL
    return f"{'https' if tls else 'http'}://{url_host}:{port}{path}"


async def _watch_certificates(certificates: CertificateWatch) -> None:
    # Rotated certificate files (cert-manager, a mounted Secret) are picked up without a restart or a SIGHUP.
    while True:
        await asyncio.sleep(_CERTIFICATE_CHECK_S)
        try:
            certificates.check()
        except Exception:  # boundary: a surprise in one check must not stop every later one
            logger.exception("checking the certificate files failed")


@contextlib.contextmanager
def _reload_on_sighup(reloads: Sequence[Callable[[], None]]) -> Iterator[None]:
    """SIGHUP reads the files in use again: the certificates, and the token of POST /hints."""

    def reload() -> None:
        for each in reloads:
            try:
                each()
            except Exception:  # boundary: one reload failing must not keep the others from running
                logger.exception("reloading on SIGHUP failed")

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, reload)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(signal.SIGHUP)


if __name__ == "__main__":
    sys.exit(main())
