"""A client's request passed through to an HTTP upstream: posted with the headers it forwards, and the upstream's
answer handed back whole, or relayed as it arrives when it is an SSE stream (`relay.py`: a stream that breaks off
still ends as a JSON-RPC error)."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from sidecar.config import UpstreamConfig
from sidecar.protocol import HEADER_SESSION_ID, RequestId, UpstreamBadResponse, UpstreamHTTPError
from sidecar.upstream.answers import ReleasingStream, Reply, json_object
from sidecar.upstream.http.auth import OAuthProtection
from sidecar.upstream.http.endpoint import UpstreamHTTP, read_limited
from sidecar.upstream.http.relay import relay_answer, relay_events
from sidecar.upstream.http.wire import Answer
from sidecar.upstream.sse import SSE_CONTENT_TYPE

__all__ = ["pass_request"]

_PASSTHROUGH_RESPONSE_HEADERS = ("Content-Type", "WWW-Authenticate")


async def pass_request(
    http: UpstreamHTTP,
    protection: OAuthProtection,
    config: UpstreamConfig,
    body: bytes | None,
    headers: dict[str, str],
    *,
    pass_session: bool = False,
    http_method: str = "POST",
    request_id: RequestId | None = None,
    idempotent: bool = False,
) -> Reply:
    """`body` sent with `headers`; `pass_session`: the upstream's session id comes back too (a session is being
    opened); `request_id`: the client's request an SSE answer answers."""
    url = config.display_url
    if body is not None:
        headers["Content-Type"] = "application/json"
    headers["Accept"] = "application/json, text/event-stream" if http_method == "POST" else SSE_CONTENT_TYPE
    names = (*_PASSTHROUGH_RESPONSE_HEADERS, HEADER_SESSION_ID) if pass_session else _PASSTHROUGH_RESPONSE_HEADERS
    # The whole answer within timeout_s (a body dripping a byte at a time must not hold a client and a
    # pooled connection for ever); an SSE answer, once it starts, is bounded by silence and max_stream_s.
    response = await http.open(http_method, body, headers, idempotent=idempotent)
    try:
        passthrough = protection.public_headers(
            {name: response.headers[name] for name in names if name in response.headers}
        )
        if response.headers.get("Content-Type", "").startswith(SSE_CONTENT_TYPE) and response.status < 300:
            response.unbounded(config.timeout_s)
            stream = ReleasingStream(_relay(response, request_id, config, http), response.release)
            return Reply(response.status, passthrough, stream=stream)
        body = await read_limited(response, http.max_response_bytes, url)
    except BaseException:
        response.release()
        raise
    response.release()
    decoded = json_object(body)
    if http_method != "POST" and response.status < 500:
        return Reply(response.status, passthrough, message=decoded, body=body)
    if response.status in (401, 403) or isinstance(decoded, dict) or (response.status < 300 and not body):
        return Reply(response.status, passthrough, message=decoded, body=body)
    if 200 <= response.status < 300:
        raise UpstreamBadResponse(url, "answer is not JSON")
    raise UpstreamHTTPError(url, response.status, response.reason or "")


def _relay(
    response: Answer, request_id: RequestId | None, config: UpstreamConfig, http: UpstreamHTTP
) -> AsyncGenerator[bytes, None]:
    # Relayed as it arrives (buffering would hold back progress); a stream that breaks off ends with a
    # JSON-RPC error event for its request rather than as a cut stream (see upstream/relay.py).
    limit = http.max_response_bytes
    if request_id is None:
        return relay_events(response, upstream=config.display_url, limit=limit)
    max_s = config.max_stream_s
    return relay_answer(response, request_id, upstream=config.display_url, limit=limit, max_s=max_s)
