"""Structured logging: JSON lines for a collector, or one readable text line per record for a person at a
terminal (`logging.format: auto` chooses by whether stderr is one); each carries whatever `extra=` fields a call
adds, and a JSON line the instance id too. Every line is scrubbed of the configuration's credential values
(`sidecar.masking`) as it is written, whatever wrote it: a child's stderr, a library's exception."""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import sys
import time
from typing import TYPE_CHECKING, Any, Literal, TextIO

from sidecar.config.shown import masked_url, shown_config
from sidecar.masking import scrub

if TYPE_CHECKING:
    from sidecar.config import SidecarConfig

__all__ = ["INSTANCE_ENV", "INSTANCE_ID", "configure_logging", "log_configuration", "resolve_format"]

logger = logging.getLogger(__name__)

INSTANCE_ENV = "MCP_SIDECAR_INSTANCE"
"""Names the process instead of a random id (a pod's name, say); each process of a fleet needs its own."""
_INSTANCE_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _instance_id() -> str:
    name = os.environ.get(INSTANCE_ENV, "")
    return name if _INSTANCE_NAME.fullmatch(name) else secrets.token_hex(4)


INSTANCE_ID = _instance_id()
"""Names this process in every log line and among the replicas on Redis, so they can be told apart."""

_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            "instance": INSTANCE_ID,
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(_scrubbed(entry), default=lambda value: scrub(str(value)))  # still one valid JSON line


def _scrubbed(value: Any) -> Any:
    """Every string in `value` (a record's fields, nested) scrubbed of credentials (`sidecar.masking.scrub`)."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {key: _scrubbed(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_scrubbed(item) for item in value]
    return value


_BARE_VALUE = re.compile(r"[^\s\"'=]+")
"""A text field value that reads unambiguously without quotes."""


class _TextFormatter(logging.Formatter):
    """`2026-07-28 14:03:07.123 INFO    message  key=value key="a value"`, in local time; a traceback follows."""

    def format(self, record: logging.LogRecord) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"
        line = f"{when} {record.levelname:<7} {record.getMessage()}"
        fields = [
            f"{key}={_text_value(value)}"
            for key, value in vars(record).items()
            if key not in _STANDARD_ATTRS and not key.startswith("_")
        ]
        if fields:
            line += "  " + " ".join(fields)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return scrub(line)


def _text_value(value: object) -> str:
    if isinstance(value, str) and _BARE_VALUE.fullmatch(value):
        return value
    if isinstance(value, bool | int | float | type(None)):
        return json.dumps(value)
    return json.dumps(value, default=str, separators=(",", ":"))  # quoted text, or a mapping or list on one line


_format: Literal["json", "text"] = "json"
"""The format configure_logging chose last."""


def resolve_format(fmt: str, stream: TextIO | None = None) -> Literal["json", "text"]:
    """`auto` is text when `stream` (stderr) is a terminal, a person reading; JSON lines otherwise."""
    if fmt == "auto":
        target = sys.stderr if stream is None else stream
        return "text" if target.isatty() else "json"
    return "text" if fmt == "text" else "json"


def configure_logging(level: str, fmt: str) -> None:
    """Route the root logger to stderr in the chosen format (json, text or auto); aiohttp's access log stays
    quiet."""
    global _format
    _format = resolve_format(fmt)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if _format == "json" else _TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def log_configuration(config: SidecarConfig) -> None:
    """The configuration at start, secrets masked. JSON: one line with all of it, for the record. Text: a short
    line (upstream, listeners, bus) at info, and all of it at debug; a page of JSON would lead the terminal."""
    shown = shown_config(config)
    if _format == "json":
        logger.info("configuration", extra={"config": shown})
        return
    listen, admin = config.listen, config.admin
    bus: str = config.bus.backend
    if bus == "redis":
        bus += f" {masked_url(config.bus.redis_url.get_secret_value())} (fallback: {config.bus.fallback})"
    logger.info(
        "configuration",
        extra={
            "upstream": config.upstream.display_url,
            "listen": f"{_host_port(listen.host, listen.port)}{listen.path}",
            "admin": _host_port(admin.host, admin.port),
            "bus": bus,
        },
    )
    logger.debug("effective configuration", extra={"config": shown})


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
