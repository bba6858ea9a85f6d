"""What a client was told of an upstream failure, and what the log says of it. The client gets a fixed phrase and
an error id (`error.data.error_id`); the log line with that id names the upstream, as it may be shown, and the
reason. Tests that check a reason find it there."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["TOLD_LINE", "told"]

TOLD_LINE = "upstream request failed"
"""The log message of the line that carries a failure's details and its error id."""


def told(error: Mapping[str, Any], log: Iterable[logging.LogRecord | Mapping[str, Any]]) -> dict[str, Any]:
    """The details logged for the JSON-RPC `error` a client got (`upstream`, `reason`, `level`), found by its
    error id among captured records or JSON log lines; fails when the client's error carries no id or none matches."""
    data = error.get("data")
    assert isinstance(data, Mapping) and isinstance(data.get("error_id"), str), f"no error id: {error}"
    error_id = data["error_id"]
    for entry in log:
        if isinstance(entry, logging.LogRecord):
            if entry.getMessage() == TOLD_LINE and getattr(entry, "error_id", None) == error_id:
                details = vars(entry)  # the `extra=` fields
                return {"upstream": details["upstream"], "reason": details["reason"], "level": entry.levelname.lower()}
        elif entry.get("msg") == TOLD_LINE and entry.get("error_id") == error_id:
            return {"upstream": entry["upstream"], "reason": entry["reason"], "level": entry["level"]}
    raise AssertionError(f"no log line carries the error id {error_id}")
