"""The sidecar's error tree; each error a client can see knows its JSON-RPC code and HTTP status.

SidecarError
├── RpcError                     an error answered to a client as a JSON-RPC error
│   ├── ParseError               -32700, 400: the body is not JSON
│   ├── InvalidRequest           -32600, 400: not a JSON-RPC request
│   │   ├── PayloadTooLarge      -32600, 413: the body is over listen.max_body_bytes
│   │   └── RequestTimeout       -32600, 408: the body did not arrive within listen.body_timeout_s
│   ├── MethodNotFound           -32601, 404
│   ├── InvalidParams            -32602, 400
│   ├── HeaderMismatch           -32020, 400: an MCP header is missing or disagrees with the body
│   ├── UnsupportedVersion       -32022, 400
│   ├── Overloaded               -32603, 503: a configured limit refuses new work
│   │   └── TooManyRequests      -32603, 429 (Retry-After): one client is over its own bound
│   └── InternalError            -32603, 500
└── UpstreamError                the upstream failed; `to_rpc()` says what the client sees (a fixed phrase
    │                            and an error id; the log line with that id has the details)
    ├── UpstreamUnavailable      connection refused or reset, DNS failure (502)
    │   └── ShuttingDown         the sidecar ended the exchange to exit within its grace (503)
    ├── UpstreamTimeout          no answer within upstream.timeout_s (504)
    ├── UpstreamBusy             upstream.max_in_flight requests already wait on a stdio server (503)
    ├── UpstreamBadResponse      an answer that is not a JSON-RPC response (502)
    ├── UpstreamHTTPError        a non-2xx status without a JSON-RPC body (502)
    └── UpstreamRpcError         a JSON-RPC error the upstream answered (passed through)
"""

from __future__ import annotations

import logging
import secrets
from typing import Any, ClassVar

from sidecar.protocol.types import JsonObject

__all__ = [
    "HeaderMismatch",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "MethodNotFound",
    "Overloaded",
    "ParseError",
    "PayloadTooLarge",
    "RequestTimeout",
    "RpcError",
    "ShuttingDown",
    "SidecarError",
    "TooManyRequests",
    "UnsupportedVersion",
    "UpstreamBadResponse",
    "UpstreamBusy",
    "UpstreamError",
    "UpstreamHTTPError",
    "UpstreamRpcError",
    "UpstreamTimeout",
    "UpstreamUnavailable",
]

logger = logging.getLogger("sidecar.upstream")


class SidecarError(Exception):
    """Root of every error the sidecar raises on purpose."""


class RpcError(SidecarError):
    """An error that reaches the client as a JSON-RPC error object."""

    code: int = -32603
    http_status: ClassVar[int] = 500

    def __init__(
        self, message: str, data: Any = None, *, http_status: int | None = None, code: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.data = data
        self.status = http_status if http_status is not None else self.http_status
        if code is not None:
            self.code = code
        self.request_id: str | int | None = None

    def to_error(self) -> JsonObject:
        """The JSON-RPC `error` member."""
        error: JsonObject = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class ParseError(RpcError):
    """The request body is not valid JSON."""

    code = -32700
    http_status = 400


class InvalidRequest(RpcError):
    """The body is JSON but not a JSON-RPC 2.0 request or notification."""

    code = -32600
    http_status = 400


class PayloadTooLarge(InvalidRequest):
    """The body is larger than `listen.max_body_bytes`."""

    http_status = 413


class RequestTimeout(InvalidRequest):
    """The body did not arrive within `listen.body_timeout_s`."""

    http_status = 408


class MethodNotFound(RpcError):
    """Unknown method, or a legacy method under a modern envelope."""

    code = -32601
    http_status = 404


class InvalidParams(RpcError):
    """Missing `_meta` keys, a malformed filter, an unknown resource."""

    code = -32602
    http_status = 400


class HeaderMismatch(RpcError):
    """A required MCP header is missing, repeated, or disagrees with the body."""

    code = -32020
    http_status = 400


class UnsupportedVersion(RpcError):
    """The requested modern protocol version is not one the sidecar serves."""

    code = -32022
    http_status = 400


class Overloaded(RpcError):
    """A configured limit (streams, concurrency) refuses new work; existing work is untouched."""

    code = -32603
    http_status = 503


class TooManyRequests(Overloaded):
    """One client is over its own bound (its queue is full, its request waited out its deadline); others are
    served. Answered with `Retry-After`."""

    http_status = 429
    retry_after_s: ClassVar[int] = 1


class InternalError(RpcError):
    """A failure inside the sidecar; the message never carries a traceback."""

    code = -32603
    http_status = 500


class UpstreamError(SidecarError):
    """The upstream could not give a usable answer.

    `str()` and `reason` are for the log and the admin listener (the upstream named as `sidecar.masking` shows it).
    A client is told only `failure`, a fixed phrase, and an error id that the log line with the details carries
    too (`to_rpc`): the client listener never names the upstream's address or command."""

    http_status: ClassVar[int] = 502
    failure: ClassVar[str] = "the upstream could not answer"
    """What failed, in words a client may read: fixed, never the upstream's address, command or reason."""

    def __init__(self, upstream: str, reason: str) -> None:
        super().__init__(f"upstream {upstream}: {reason}")
        self.upstream = upstream
        self.reason = reason
        self._error_id: str | None = None

    @property
    def is_transport_failure(self) -> bool:
        """True when the upstream was not reached or did not answer (it may be down)."""
        return True

    def told_id(self, level: int = logging.WARNING) -> str:
        """The id that names this failure to a client; the first time, the log line with the details (the upstream
        as it may be shown, the reason) is written with it, so one search finds what the client was not told."""
        if self._error_id is None:
            self._error_id = secrets.token_hex(6)
            logger.log(
                level,
                "upstream request failed",
                extra={"error_id": self._error_id, "upstream": self.upstream, "reason": self.reason},
            )
        return self._error_id

    def to_rpc(self, *, with_id: bool = True) -> RpcError:
        """What a client sees: an internal error with a fixed phrase and the error id (logged with the details).
        Without `with_id`, the phrase alone and nothing logged: for a summary that shows no data (an entry of an
        ack's left-out list, counted in the log by reason)."""
        data = {"error_id": self.told_id()} if with_id else None
        return InternalError(self.failure, data, http_status=self.http_status)


class UpstreamUnavailable(UpstreamError):
    """Connection refused or reset, or the name did not resolve."""

    failure = "the upstream is unavailable"


class ShuttingDown(UpstreamUnavailable):
    """The sidecar is shutting down and ended the exchange, so the client gets an answer before the exit."""

    http_status = 503
    failure = "the sidecar is shutting down"

    @property
    def is_transport_failure(self) -> bool:
        return False  # the upstream is fine: not a reason to report it down


class UpstreamTimeout(UpstreamError):
    """No answer within `upstream.timeout_s`."""

    http_status = 504
    failure = "the upstream did not answer in time"


class UpstreamBusy(UpstreamError):
    """A configured bound on requests in flight to the upstream refuses this one; the upstream itself is fine."""

    http_status = 503
    failure = "the upstream is busy"

    @property
    def is_transport_failure(self) -> bool:
        return False


class UpstreamBadResponse(UpstreamError):
    """An answer that is not a JSON-RPC response: garbage bytes, truncated stream, wrong shape."""

    failure = "the upstream gave an unusable answer"

    @property
    def is_transport_failure(self) -> bool:
        # The upstream answered, badly, for this one request: it is not down (readiness does not flap).
        return False


class UpstreamHTTPError(UpstreamError):
    """A non-2xx HTTP status without a JSON-RPC error body."""

    def __init__(self, upstream: str, status: int, reason: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(upstream, f"HTTP {status} {reason}".strip())
        self.status = status
        # Only auth challenge headers are kept, so a 401/403 can pass through to the client.
        self.headers = headers or {}

    @property
    def is_auth_failure(self) -> bool:
        return self.status in (401, 403)

    def to_rpc(self, *, with_id: bool = True) -> RpcError:
        if self.is_auth_failure:  # a client's own credential refused: its business, not an operator's alarm
            data = {"error_id": self.told_id(logging.INFO)} if with_id else None
            return InvalidRequest(
                f"the upstream refused the request (HTTP {self.status})", data, http_status=self.status
            )
        data = {"error_id": self.told_id()} if with_id else None
        return InternalError(f"the upstream answered HTTP {self.status}", data, http_status=self.http_status)

    @property
    def is_transport_failure(self) -> bool:
        return self.status >= 500


class UpstreamRpcError(UpstreamError):
    """The upstream answered with a JSON-RPC error; it passes through to the client."""

    def __init__(self, upstream: str, error: JsonObject, http_status: int = 200) -> None:
        super().__init__(upstream, str(error.get("message", "error")))
        self.error = error
        self.code = error.get("code")
        self.upstream_status = http_status

    @property
    def is_transport_failure(self) -> bool:
        return False

    def to_rpc(self, *, with_id: bool = True) -> RpcError:  # passed through: the upstream's own words, no id
        code = self.code if isinstance(self.code, int) else InternalError.code
        return RpcError(
            str(self.error.get("message", "")), self.error.get("data"), http_status=self.upstream_status, code=code
        )
