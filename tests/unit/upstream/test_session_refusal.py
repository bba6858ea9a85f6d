"""Which 4xx answers on one of the sidecar's upstream sessions mean the upstream forgot the session."""

from __future__ import annotations

import orjson
import pytest

from sidecar.upstream.http.session_refusal import refuses_session


def _error(message: str, data: object = None) -> bytes:
    error: dict[str, object] = {"code": -32000, "message": message}
    if data is not None:
        error["data"] = data
    return orjson.dumps({"jsonrpc": "2.0", "id": None, "error": error})


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (404, b""),  # the spec's answer
        (404, _error("Not Found")),
        (400, _error("Bad Request: No valid session ID provided")),  # server-everything after a restart
        (400, _error("Bad Request", "unknown session")),
        (400, b"Session expired"),  # plain text
        (410, _error("session terminated")),
        (422, _error("Invalid session id")),
        (400, _error("Mcp-Session-Id header missing")),
    ],
)
def test_a_404_or_a_4xx_that_says_the_session_is_gone_is_a_refusal(status: int, body: bytes) -> None:
    assert refuses_session(status, body, suspect=False)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, _error("Invalid params: uri is required")),  # about the request, not the session
        (400, b"Bad Request"),
        (409, _error("session already initialized")),  # names the session, but it is not gone
        (401, _error("invalid session token")),  # a credential refused: a new session would not change it
        (403, _error("session not found")),
        (429, _error("too many requests on this session; unknown limit")),
        (408, _error("session timed out: invalid")),
        (500, _error("unknown session")),  # a fault, not an answer about the session
        (200, _error("unknown session")),
    ],
)
def test_other_answers_are_not(status: int, body: bytes) -> None:
    assert not refuses_session(status, body, suspect=False)


@pytest.mark.parametrize("status", [400, 409, 422])
def test_any_4xx_on_a_session_from_before_an_outage_is_a_refusal(status: int) -> None:
    assert refuses_session(status, _error("Bad Request"), suspect=True)


@pytest.mark.parametrize("status", [401, 403, 408, 429, 500, 502])
def test_but_not_a_refused_credential_a_busy_upstream_or_a_fault(status: int) -> None:
    assert not refuses_session(status, _error("Bad Request"), suspect=True)


def test_only_the_head_of_a_long_answer_is_read() -> None:
    body = b"x" * 10_000 + b" unknown session"
    assert not refuses_session(400, body, suspect=False)
    assert refuses_session(400, b"unknown session " + b"x" * 10_000, suspect=False)
