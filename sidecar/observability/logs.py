"""Structured logging: JSON lines (or text) carrying an instance id and whatever `extra=` fields a call adds."""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import sys
import time
from typing import Any

__all__ = ["INSTANCE_ENV", "INSTANCE_ID", "configure_logging"]

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
        return json.dumps(entry, default=str)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        extras = {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")}
        return base + ("  " + " ".join(f"{k}={v}" for k, v in extras.items()) if extras else "")


def configure_logging(level: str, fmt: str) -> None:
    """Route the root logger to stderr in the chosen format; aiohttp's access log stays quiet."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
