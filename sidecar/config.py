"""Configuration: frozen pydantic models loaded from YAML, with `MCP_SIDECAR__SECTION__KEY` overrides."""

from __future__ import annotations

import datetime
import logging
import os
import shlex
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

__all__ = [
    "AdminConfig",
    "BusConfig",
    "CacheConfig",
    "ConfigError",
    "ListenConfig",
    "LoggingConfig",
    "MetricsConfig",
    "PollingConfig",
    "SidecarConfig",
    "StreamsConfig",
    "UpstreamConfig",
    "load_config",
]

logger = logging.getLogger(__name__)

ENV_PREFIX = "MCP_SIDECAR__"

DEFAULT_PORT = 8080
DEFAULT_ADMIN_PORT = 9464
DEFAULT_MAX_BODY_BYTES = 1_048_576
DEFAULT_SHUTDOWN_GRACE_S = 10.0
DEFAULT_HEADER_TIMEOUT_S = 15.0  # a slow client is cut long before nginx's 60 s client_header_timeout would
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_MAX_CLIENT_CONNECTIONS = 12_000  # room for streams.max_streams (10,000) plus ordinary requests
DEFAULT_UPSTREAM_TIMEOUT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_MAX_CONNECTIONS = 100
DEFAULT_MAX_STREAM_S = 900.0
DEFAULT_MAX_REQUESTS_PER_CONTEXT = 32  # a third of the pool: two busy clients still leave room for a third
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1_048_576
DEFAULT_MAX_IN_FLIGHT = 256
DEFAULT_STOP_GRACE_S = 5.0
DEFAULT_RESTART_BACKOFF_INITIAL_MS = 500
DEFAULT_RESTART_BACKOFF_MAX_MS = 30_000
DEFAULT_STDERR_LINES_PER_S = 20.0
DEFAULT_INTERVAL_MS = 5_000
DEFAULT_MIN_INTERVAL_MS = 250
DEFAULT_MAX_INTERVAL_MS = 300_000
DEFAULT_JITTER = 0.1
DEFAULT_BACKOFF_INITIAL_MS = 1_000
DEFAULT_BACKOFF_MAX_MS = 60_000
DEFAULT_POLL_CONCURRENCY = 64
DEFAULT_LINGER_MS = 5_000
DEFAULT_MAX_NATIVE_STREAMS = 100
DEFAULT_MAX_HINTED_POLLS_PER_S = 200.0  # a write hinting 2,000 watches costs one extra round over ten seconds
DEFAULT_MAX_BASELINES_PER_S = 200.0
DEFAULT_REVALIDATE_DEBOUNCE_MS = 10  # batches a burst of writes; short enough that a write is seen at once
DEFAULT_CACHE_ENTRIES = 10_000
DEFAULT_CACHE_BYTES = 64 * 1_048_576
DEFAULT_LEASE_MS = 5_000
DEFAULT_SESSION_IDLE_S = 1_800.0
DEFAULT_MAX_SESSIONS = 10_000
DEFAULT_MAX_SESSIONS_PER_CONTEXT = 1_000
DEFAULT_SESSION_UNUSED_S = 60.0
DEFAULT_KEEPALIVE_S = 15.0  # aiohttp-sse's default; well under common 60 s proxy idle timeouts
DEFAULT_MAX_STREAMS = 10_000
DEFAULT_MAX_URIS_PER_STREAM = 1_000
DEFAULT_MAX_URI_LENGTH = 2_048

_FORWARD_HEADERS = ["authorization", "traceparent", "tracestate", "baggage"]
_NON_IDENTITY_HEADERS = ["traceparent", "tracestate", "baggage"]
_IDENTITY_WORDS = ("auth", "token", "key", "cookie", "session", "user", "account", "tenant", "secret", "credential")


class ConfigError(Exception):
    """The configuration is unusable; the message names each bad key and why."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ListenConfig(_Section):
    host: str = Field("127.0.0.1", description="Address to bind; loopback by default.")
    port: int = Field(DEFAULT_PORT, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    path: str = Field("/mcp", description="The MCP endpoint path.")
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1024, description="Larger request bodies get 413.")
    allowed_origins: list[str] = Field(
        default_factory=list, description="Origins allowed besides localhost ones (when bound to loopback)."
    )
    shutdown_grace_s: float = Field(
        DEFAULT_SHUTDOWN_GRACE_S, gt=0, description="How long shutdown waits for requests in flight."
    )
    header_timeout_s: float = Field(
        DEFAULT_HEADER_TIMEOUT_S, gt=0, description="A new or idle connection closes unless a whole request head comes."
    )
    body_timeout_s: float = Field(DEFAULT_BODY_TIMEOUT_S, gt=0, description="A request body must arrive within this.")
    max_connections: int = Field(
        DEFAULT_MAX_CLIENT_CONNECTIONS, ge=1, description="Client connections at once; one more is closed at accept."
    )

    @field_validator("path")
    @classmethod
    def _path_is_absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value


class UpstreamConfig(_Section):
    url: str = Field("", description="The upstream MCP endpoint (HTTP); set this or `command`. Empty: not set.")
    command: list[str] | None = Field(
        None,
        description="A stdio MCP server to start instead of `url`: program and arguments (a string is split as a "
        "shell would, without running a shell).",
    )
    env: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="Environment variables for `command`, added to a minimal inherited one (PATH, HOME, LANG, ...).",
    )
    cwd: str | None = Field(None, description="Working directory of `command`; absent: the sidecar's own.")
    protocol: Literal["auto", "2026-07-28", "2025-11-25"] = Field(
        "auto", description="auto probes server/discover once, falling back to initialize."
    )
    timeout_s: float = Field(
        DEFAULT_UPSTREAM_TIMEOUT_S,
        gt=0,
        description="A whole JSON answer (connect, headers, body) must arrive within this; an SSE answer may not "
        "stay silent longer.",
    )
    max_stream_s: float = Field(
        DEFAULT_MAX_STREAM_S, gt=0, description="An SSE answer (a long tool call with progress) ends after this."
    )
    max_requests_per_context: int = Field(
        DEFAULT_MAX_REQUESTS_PER_CONTEXT,
        ge=1,
        description="Requests one client (authorization context) may have in flight upstream; more get 429, so "
        "one client cannot take the whole connection pool.",
    )
    connect_timeout_s: float = Field(
        DEFAULT_CONNECT_TIMEOUT_S, gt=0, description="TCP connect timeout; for `command`, the liveness probe's."
    )
    max_connections: int = Field(DEFAULT_MAX_CONNECTIONS, ge=1, description="Connection pool size.")
    max_response_bytes: int = Field(
        DEFAULT_MAX_RESPONSE_BYTES, ge=1024, description="Larger answers fail (for `command`: longer lines)."
    )
    max_in_flight: int = Field(
        DEFAULT_MAX_IN_FLIGHT, ge=1, description="Requests in flight to a `command` server at once; more get 503."
    )
    stop_grace_s: float = Field(
        DEFAULT_STOP_GRACE_S, gt=0, description="A `command` server's process group gets SIGKILL this long after TERM."
    )
    restart_backoff_initial_ms: int = Field(
        DEFAULT_RESTART_BACKOFF_INITIAL_MS, ge=1, description="First restart delay of a `command` server, doubling."
    )
    restart_backoff_max_ms: int = Field(DEFAULT_RESTART_BACKOFF_MAX_MS, ge=1, description="Cap on the restart delay.")
    stderr_lines_per_s: float = Field(
        DEFAULT_STDERR_LINES_PER_S, ge=0, description="stderr lines of a `command` server logged per second; 0: none."
    )
    headers: dict[str, SecretStr] = Field(default_factory=dict, description="Extra headers sent upstream.")
    forward_headers: list[str] = Field(
        default_factory=lambda: list(_FORWARD_HEADERS), description="Client headers forwarded upstream."
    )
    non_identity_headers: list[str] = Field(
        default_factory=lambda: list(_NON_IDENTITY_HEADERS),
        description="Forwarded headers that say nothing about who the client is; every other forwarded header "
        "is part of the client's authorization context (cache, watches, upstream sessions are kept per context).",
    )
    public_url: str | None = Field(
        None,
        description="The MCP URL clients use to reach the sidecar; auth challenges and protected-resource "
        "metadata are rewritten to it. Absent: passed through as the upstream sent them.",
    )

    @field_validator("protocol", mode="before")
    @classmethod
    def _date_as_written(cls, value: Any) -> Any:
        # `protocol: 2025-11-25` unquoted is a YAML date; the version is the same text.
        return value.isoformat() if isinstance(value, datetime.date) else value

    @field_validator("public_url")
    @classmethod
    def _public_url_is_http(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value

    @field_validator("url", mode="before")
    @classmethod
    def _url_null_is_unset(cls, value: Any) -> Any:
        return "" if value is None else value

    @field_validator("url")
    @classmethod
    def _url_is_http(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL (a stdio server goes in upstream.command)")
        return value

    @field_validator("command", mode="before")
    @classmethod
    def _split_command(cls, value: Any) -> Any:
        # From the environment or a flag the command is one string: split it as a shell would, run no shell.
        if isinstance(value, str):
            try:
                return shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"cannot split into program and arguments: {exc}") from exc
        return value

    @field_validator("command")
    @classmethod
    def _command_names_a_program(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or not value[0]):
            raise ValueError("must name a program, then its arguments")
        return value

    @model_validator(mode="after")
    def _one_upstream(self) -> UpstreamConfig:
        if not self.url and self.command is None:
            raise ValueError(
                "neither url nor command is set: set upstream.url (an HTTP MCP endpoint) or upstream.command "
                "(a stdio MCP server to start)"
            )
        if self.url and self.command is not None:
            raise ValueError("url and command are both set; keep one of them")
        if self.command is not None:
            if self.headers or self.public_url is not None:
                name = "headers" if self.headers else "public_url"
                raise ValueError(
                    f"upstream.{name} is for an HTTP upstream; a stdio server (upstream.command) has no HTTP "
                    "(pass what it needs in upstream.env)"
                )
        elif self.env or self.cwd is not None:
            raise ValueError("upstream.env and upstream.cwd are for upstream.command; an HTTP upstream has neither")
        if self.restart_backoff_initial_ms > self.restart_backoff_max_ms:
            raise ValueError(
                f"restart_backoff_initial_ms ({self.restart_backoff_initial_ms}) must not exceed "
                f"restart_backoff_max_ms ({self.restart_backoff_max_ms})"
            )
        return self

    @property
    def is_stdio(self) -> bool:
        """True when the upstream is a child process spoken to on its stdin and stdout."""
        return self.command is not None

    @property
    def display_url(self) -> str:
        """The upstream for logs, errors and the status page: the URL with any user:password masked, or
        `stdio: <command>` (environment values, the secrets of a stdio server, are never part of it)."""
        if not self.url:
            return "stdio: " + shlex.join(self.command or [])
        parts = urlsplit(self.url)
        if parts.username is None and parts.password is None:
            return self.url
        host = parts.hostname or ""
        netloc = f"***@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))

    @field_validator("forward_headers", "non_identity_headers")
    @classmethod
    def _lowercase(cls, value: list[str]) -> list[str]:
        return [name.lower() for name in value]

    def identity_warnings(self) -> list[str]:
        """Forwarded headers declared non-identifying whose names suggest they identify the client."""
        forwarded = set(self.forward_headers)
        return [
            f"upstream.non_identity_headers: {name!r} looks like it identifies the client; clients sending "
            "different values would share cache entries, watches and upstream sessions"
            for name in self.non_identity_headers
            if name in forwarded and any(word in name for word in _IDENTITY_WORDS)
        ]


class PollingConfig(_Section):
    default_interval_ms: int = Field(DEFAULT_INTERVAL_MS, ge=1, description="Used when ttlMs is absent or 0.")
    min_interval_ms: int = Field(DEFAULT_MIN_INTERVAL_MS, ge=1, description="Floor for ttlMs and for hints.")
    max_interval_ms: int = Field(DEFAULT_MAX_INTERVAL_MS, ge=1, description="Ceiling for ttlMs.")
    jitter: float = Field(DEFAULT_JITTER, ge=0, lt=1, description="Each interval is scaled by 1 +/- jitter.")
    backoff_initial_ms: int = Field(DEFAULT_BACKOFF_INITIAL_MS, ge=1)
    backoff_max_ms: int = Field(DEFAULT_BACKOFF_MAX_MS, ge=1)
    max_concurrency: int = Field(DEFAULT_POLL_CONCURRENCY, ge=1, description="Polls in flight at once.")
    linger_ms: int = Field(DEFAULT_LINGER_MS, ge=0, description="A watch outlives its last stream this long.")
    revalidate_debounce_ms: int = Field(
        DEFAULT_REVALIDATE_DEBOUNCE_MS, ge=0, description="Writes through the sidecar hint watches after this pause."
    )
    native_notifications: bool = Field(
        True,
        description="Subscribe upstream when it can push (resources.subscribe, listChanged, listen) and poll at "
        "once on its notifications; covered keys are polled only every max_interval_ms. false: poll only.",
    )
    max_hinted_polls_per_s: float = Field(
        DEFAULT_MAX_HINTED_POLLS_PER_S,
        gt=0,
        description="Extra polls that hints (writes, the upstream's notifications, recovery) may cause a second, "
        "across all watches; more are deferred, never dropped.",
    )
    native_backstop_ms: int = Field(
        0,
        ge=0,
        description="Poll interval of keys the upstream's own notifications cover. 0: their usual interval (the "
        "notifications only make changes arrive sooner); set it (e.g. max_interval_ms) only for an upstream known to "
        "announce every change: the reference server declares resources.subscribe and announces nothing until asked.",
    )
    max_native_streams: int = Field(
        DEFAULT_MAX_NATIVE_STREAMS, ge=0, description="Upstream notification streams at most (one per context)."
    )
    max_baselines_per_s: float = Field(
        DEFAULT_MAX_BASELINES_PER_S,
        gt=0,
        description="First reads of new subscriptions one client (context) may cause a second; more are left out "
        "of the ack (a resource found missing is not read again for default_interval_ms).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> PollingConfig:
        if self.min_interval_ms > self.max_interval_ms:
            raise ValueError(
                f"min_interval_ms ({self.min_interval_ms}) must not exceed max_interval_ms ({self.max_interval_ms})"
            )
        if 0 < self.native_backstop_ms < self.min_interval_ms:
            raise ValueError(f"native_backstop_ms must be 0 or at least min_interval_ms ({self.min_interval_ms})")
        if self.backoff_initial_ms > self.backoff_max_ms:
            raise ValueError(
                f"backoff_initial_ms ({self.backoff_initial_ms}) must not exceed backoff_max_ms ({self.backoff_max_ms})"
            )
        return self


class CacheConfig(_Section):
    default_scope: Literal["public", "private"] = Field(
        "private", description="cacheScope stamped on legacy results; private is the only safe default."
    )
    default_ttl_ms: int = Field(0, ge=0, description="ttlMs stamped on legacy results; 0 means always stale.")
    max_entries: int = Field(DEFAULT_CACHE_ENTRIES, ge=0, description="Cached results at most; 0 turns caching off.")
    max_bytes: int = Field(DEFAULT_CACHE_BYTES, ge=0, description="Bytes of cached results at most.")
    public_requires_verified_context: bool = Field(
        True,
        description="Serve a cached public result to a context only after the upstream answered that context "
        "for that request once (the spec allows sharing public results with anyone; a careful proxy does not "
        "hand them to clients the upstream would refuse). false: any client gets them.",
    )


class StreamsConfig(_Section):
    keepalive_s: float = Field(DEFAULT_KEEPALIVE_S, gt=0, description="Comment line on quiet listen streams.")
    max_streams: int = Field(DEFAULT_MAX_STREAMS, ge=1, description="Listen streams per process.")
    max_uris_per_stream: int = Field(DEFAULT_MAX_URIS_PER_STREAM, ge=1, description="Extra URIs leave the ack.")
    max_uri_length: int = Field(DEFAULT_MAX_URI_LENGTH, ge=16, description="Longer URIs are -32602.")
    max_sessions: int = Field(
        DEFAULT_MAX_SESSIONS, ge=1, description="2025-11-25 client sessions per process; more get 503."
    )
    session_idle_s: float = Field(
        DEFAULT_SESSION_IDLE_S, gt=0, description="A 2025-11-25 session idle this long (no GET stream) ends."
    )
    max_sessions_per_context: int = Field(
        DEFAULT_MAX_SESSIONS_PER_CONTEXT,
        ge=1,
        description="2025-11-25 sessions one client (authorization context; every anonymous client shares one) may "
        "hold; more get 429.",
    )
    session_unused_s: float = Field(
        DEFAULT_SESSION_UNUSED_S,
        gt=0,
        description="A 2025-11-25 session that sent no request and opened no stream after initialize ends this soon.",
    )


class BusConfig(_Section):
    backend: Literal["memory", "redis"] = Field("memory", description="redis for several replicas.")
    redis_url: SecretStr = Field(SecretStr("redis://127.0.0.1:6379/0"), description="Used when backend is redis.")
    fallback: Literal["none", "local"] = Field(
        "none", description="Redis unreachable at start: none fails, local starts polling on its own."
    )
    lease_ms: int = Field(DEFAULT_LEASE_MS, ge=300, description="Poll lease life; renewed at a third of it.")


class MetricsConfig(_Section):
    path: str = Field("/metrics", description="Prometheus scrape path (on the admin listener).")


class AdminConfig(_Section):
    host: str = Field(
        "127.0.0.1", description="Address of the admin listener (/metrics, /status, /healthz, /readyz); loopback."
    )
    port: int = Field(DEFAULT_ADMIN_PORT, ge=0, le=65535, description="Its TCP port; 0 picks a free one.")


class LoggingConfig(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "text"] = "json"


class SidecarConfig(_Section):
    """The whole configuration; each component receives its own section."""

    listen: ListenConfig = Field(default_factory=ListenConfig)
    upstream: UpstreamConfig
    polling: PollingConfig = Field(default_factory=PollingConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    streams: StreamsConfig = Field(default_factory=StreamsConfig)
    bus: BusConfig = Field(default_factory=BusConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    admin: AdminConfig = Field(default_factory=AdminConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @model_validator(mode="before")
    @classmethod
    def _upstream_section_checked(cls, data: Any) -> Any:
        # Without an upstream section the upstream's own rule names what is missing ("set url or command"),
        # instead of a bare "field required".
        if isinstance(data, dict) and "upstream" not in data:
            return {**data, "upstream": {}}
        return data

    def with_overrides(self, overrides: dict[str, dict[str, Any]]) -> SidecarConfig:
        """A copy with `{section: {key: value}}` applied and validated again (see `load_config` for the upstream)."""
        data = self.model_dump(mode="python")
        _merge(data, overrides)
        return _validate(_reveal(data))


_UPSTREAM_TARGETS = ("url", "command")
_TARGET_ONLY_KEYS = {"url": ("headers", "public_url"), "command": ("env", "cwd")}
"""Keys that mean something for one kind of upstream only."""


def _switch_upstream(upstream: dict[str, Any], chosen: str) -> None:
    """`chosen` (url or command) names the upstream: drop the other target, and the keys only it used."""
    other = "command" if chosen == "url" else "url"
    for key in (other, *_TARGET_ONLY_KEYS[other]):
        upstream.pop(key, None)


def _merge(data: dict[str, Any], overrides: dict[str, dict[str, Any]]) -> None:
    for section, values in overrides.items():
        target = data.setdefault(section, {})
        if not isinstance(target, dict):
            raise ConfigError(f"{section}: must be a mapping")
        chosen = [key for key in _UPSTREAM_TARGETS if values.get(key)]
        if section == "upstream" and len(chosen) == 1:
            _switch_upstream(target, chosen[0])  # an override naming the upstream replaces the one below it
        target.update(values)


def _reveal(data: Any) -> Any:
    # model_dump keeps SecretStr objects; unwrap them so validation sees plain values again.
    if isinstance(data, dict):
        return {key: _reveal(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_reveal(value) for value in data]
    if isinstance(data, SecretStr):
        return data.get_secret_value()
    return data


def load_config(
    path: str | Path | None = None,
    environ: dict[str, str] | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> SidecarConfig:
    """Read YAML (if any), apply `MCP_SIDECAR__SECTION__KEY=value` overrides, then `overrides` (command-line flags),
    validate.

    `upstream.url` and `upstream.command` are one choice: the environment or `overrides` naming either replaces
    the other from the file. Raises ConfigError whose message names every bad key.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
        # A section whose keys are all commented out reads as null: it means "all defaults".
        data = {section: {} if values is None else values for section, values in loaded.items()}
    origins: dict[tuple[str, str], str] = {}
    """(section, key) -> the environment variable that set it (named in errors; url/command choose the upstream)."""
    for key, raw in (environ if environ is not None else dict(os.environ)).items():
        if not key.startswith(ENV_PREFIX):
            continue
        parts = key[len(ENV_PREFIX) :].lower().split("__")
        if len(parts) != 2 or not all(parts):
            raise ConfigError(f"{key}: expected {ENV_PREFIX}SECTION__KEY")
        section = data.setdefault(parts[0], {})
        if not isinstance(section, dict):
            raise ConfigError(f"{parts[0]}: must be a mapping")
        # Plain text stays text (a token may hold "#" or read "no"); pydantic converts numbers and booleans.
        # Only a list or mapping needs parsing, written in YAML/JSON flow style.
        try:
            section[parts[1]] = yaml.safe_load(raw) if raw.lstrip()[:1] in ("[", "{") else raw
        except yaml.YAMLError as exc:
            raise ConfigError(f"{key}: not a valid YAML/JSON list or mapping: {exc}") from exc
        origins[(parts[0], parts[1])] = key
    _choose_upstream(data, {f"{section}.{key}" for section, key in origins})
    _merge(data, overrides or {})
    return _validate(data, origins)


def _choose_upstream(data: dict[str, Any], named: set[str]) -> None:
    # The environment naming one of url and command replaces the file's upstream (naming both is an error).
    chosen = [key for key in _UPSTREAM_TARGETS if f"upstream.{key}" in named]
    upstream = data.get("upstream")
    if len(chosen) == 1 and isinstance(upstream, dict):
        kept = {key: value for key, value in upstream.items() if f"upstream.{key}" in named}
        _switch_upstream(upstream, chosen[0])
        upstream.update(kept)


def _validate(data: dict[str, Any], origins: dict[tuple[str, str], str] | None = None) -> SidecarConfig:
    try:
        return SidecarConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = tuple(str(part) for part in error["loc"])
            key = ".".join(loc) or "(top level)"
            message = (
                "unknown key" if error["type"] == "extra_forbidden" else error["msg"].removeprefix("Value error, ")
            )
            variable = (origins or {}).get((loc[0], loc[1])) if len(loc) >= 2 else None
            problems.append(f"{key}: {message}" + (f" (from {variable})" if variable else ""))
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems)) from exc
