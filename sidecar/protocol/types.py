"""The JSON-RPC types every part shares: one name for a JSON object and one for a request id."""

from __future__ import annotations

from typing import Any

__all__ = ["JsonObject", "RequestId"]

JsonObject = dict[str, Any]
"""A JSON object as orjson reads it: a request's params, a result, a message."""

RequestId = str | int
"""A JSON-RPC request id (a null id is written `None` where a message may have none)."""
