"""`upstream`: an HTTP MCP endpoint (`url`) or a stdio server to start (`command`), and how to talk to it."""

from __future__ import annotations

import datetime
import os
import re
import shlex
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from sidecar.config.base import Section
from sidecar.config.syntax import check_header_name, check_header_value, check_http_url
from sidecar.config.tls import UpstreamTLS
from sidecar.masking import shown_upstream

__all__ = ["UpstreamConfig"]

DEFAULT_UPSTREAM_TIMEOUT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_MAX_CONNECTIONS = 100
DEFAULT_MAX_STREAM_S = 900.0
DEFAULT_MAX_QUEUED_PER_CLIENT = 1_024  # 1,000 requests at once from one client on an idle sidecar wait, none fail
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1_048_576
DEFAULT_MAX_IN_FLIGHT = 256
DEFAULT_STOP_GRACE_S = 5.0
DEFAULT_RESTART_BACKOFF_INITIAL_MS = 500
DEFAULT_RESTART_BACKOFF_MAX_MS = 30_000
DEFAULT_STDERR_LINES_PER_S = 20.0
_FORWARD_HEADERS = ["authorization", "traceparent", "tracestate", "baggage"]
_NON_IDENTITY_HEADERS = ["traceparent", "tracestate", "baggage"]
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_IDENTITY_WORDS = ("auth", "token", "key", "cookie", "session", "user", "account", "tenant", "secret", "credential")


class UpstreamConfig(Section):
    renamed = {"max_requests_per_context": "max_requests_per_client"}

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
    inherit_env: list[str] = Field(
        default_factory=list,
        description="More variables `command` inherits from the sidecar's environment, by name, besides PATH, HOME, "
        "locale and the proxy and CA ones (HTTP_PROXY, HTTPS_PROXY, NO_PROXY, ALL_PROXY and their lowercase forms, "
        "SSL_CERT_FILE, SSL_CERT_DIR, REQUESTS_CA_BUNDLE, NODE_EXTRA_CA_CERTS, PIP_INDEX_URL, UV_INDEX_URL, "
        "NPM_CONFIG_REGISTRY), which it always gets when they are set.",
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
    max_requests_per_client: int | None = Field(
        None,
        ge=1,
        description="Requests one client may have in flight upstream; more wait their turn, so one client's slow "
        "requests cannot take the whole pool. Absent: three quarters of the upstream's capacity (max_connections; "
        "for `command`, max_in_flight less polling.max_concurrency).",
    )
    max_queued_per_client: int = Field(
        DEFAULT_MAX_QUEUED_PER_CLIENT,
        ge=0,
        description="Requests one client may have waiting for a free slot; one more gets 429 with Retry-After (a "
        "request that waits longer than timeout_s does too).",
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
    tls: UpstreamTLS = Field(
        default_factory=UpstreamTLS, description="For an https:// url: the CA to trust, a client certificate, SNI."
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
        if value is not None:
            check_http_url(value)
        return value

    @field_validator("url", mode="before")
    @classmethod
    def _url_null_is_unset(cls, value: Any) -> Any:
        return "" if value is None else value

    @field_validator("url")
    @classmethod
    def _url_is_http(cls, value: str) -> str:
        if value:
            check_http_url(value, "a stdio server goes in upstream.command")
        return value

    @field_validator("headers")
    @classmethod
    def _headers_are_http(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, secret in value.items():
            check_header_name(name)
            check_header_value(name, secret.get_secret_value())
        return value

    @field_validator("env")
    @classmethod
    def _env_can_be_passed(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, secret in value.items():
            if not name or "=" in name or "\0" in name:
                raise ValueError(f"{name!r} is not an environment variable name (no '=', not empty)")
            if "\0" in secret.get_secret_value():
                raise ValueError(f"the value of {name} holds a NUL character")
        return value

    @field_validator("cwd")
    @classmethod
    def _cwd_is_a_directory(cls, value: str | None) -> str | None:
        if value is not None and not os.path.isdir(value):
            raise ValueError(
                f"{value!r} is not a directory" + ("" if os.path.exists(value) else " (it does not exist)")
            )
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

    @field_validator("inherit_env")
    @classmethod
    def _legal_env_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name (letters, digits, _; no digit first)")
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
        elif self.inherit_env:
            raise ValueError("upstream.inherit_env is for upstream.command; an HTTP upstream starts no process")
        if self.tls.configured and not self.url.startswith("https://"):
            raise ValueError("upstream.tls is for an https:// url")
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
        """The upstream for logs, errors and the status page: its URL or `stdio: <command>`, credentials masked by
        the one rule every surface uses (`sidecar.masking`); environment values are never part of it."""
        return shown_upstream(self.url, self.command)

    @field_validator("forward_headers", "non_identity_headers")
    @classmethod
    def _lowercase(cls, value: list[str]) -> list[str]:
        for name in value:
            check_header_name(name)
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
