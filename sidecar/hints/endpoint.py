"""`POST /hints`: the source of truth says what changed, and the watches it names look at the upstream soon.

    POST /hints                      (admin listener only, and only with hints.token_file set)
    Authorization: Bearer <token>
    {"uris": ["catalog://price", "catalog://plans/*"], "lists": ["tools"]}

Answers 202 `{"hinted": N, "warm_ms": W}` (the watches of this process that match, on replicas each hears it
and hints its own; each stays warm, looking again while it sees no change, for up to W ms), 401 for a missing
or wrong token (nothing is looked at), 400 for a body of another shape, 413 over 64 KiB.
Every error is a JSON object `{"error": "..."}`. A hint is never a change: each look decides for itself whether
anyone is told.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, get_args

import orjson
from aiohttp import web

from sidecar.hints.token import HintToken
from sidecar.observability.metrics import HINT_OUTCOMES, Metrics
from sidecar.watch.source_hints import LIST_NAMES, ListName, SourceHint

__all__ = ["MAX_BODY_BYTES", "MAX_GLOBS", "BadHint", "HintEndpoint", "parse_hint"]

MAX_BODY_BYTES = 64 * 1024
MAX_GLOBS = 100
"""Globs one request may carry (exact URIs are not counted): each is tried against every watched URI."""
_FIELDS = frozenset({"uris", "lists"})


class BadHint(ValueError):
    """A body that is not a hint; the message says why (the 400's error)."""


def _error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


def parse_hint(raw: bytes) -> SourceHint:
    """The hint a body names; raises BadHint saying what is wrong with it."""
    try:
        data: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BadHint("the body is not JSON") from None
    if not isinstance(data, dict):
        raise BadHint('the body must be a JSON object: {"uris": [...], "lists": [...]}')
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise BadHint(f"unknown member {unknown[0]!r} (expected uris and, optionally, lists)")
    if "uris" not in data:
        raise BadHint("uris is missing: a list of URIs or globs (it may be empty when lists names something)")
    uris, lists = data["uris"], data.get("lists", [])
    if not isinstance(uris, list) or not all(isinstance(uri, str) and uri for uri in uris):
        raise BadHint("uris must be a list of non-empty strings (URIs, or globs where * matches any run)")
    names = get_args(ListName)
    if not isinstance(lists, list) or not all(isinstance(name, str) and name in LIST_NAMES for name in lists):
        raise BadHint(f"lists must be a list of {', '.join(names)}")
    globs = sum("*" in uri for uri in uris)
    if globs > MAX_GLOBS:
        raise BadHint(f"{globs} globs: at most {MAX_GLOBS} a request (exact URIs are not limited)")
    if not uris and not lists:
        raise BadHint("the hint names nothing: give uris, lists or both")
    return SourceHint(tuple(dict.fromkeys(uris)), tuple(dict.fromkeys(lists)))


async def _body(request: web.Request) -> bytes | None:
    """The body, or None when it is over MAX_BODY_BYTES (read no further than that)."""
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        return None
    chunks, size = [], 0
    while chunk := await request.content.read(MAX_BODY_BYTES + 1 - size):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
    return b"".join(chunks)


class HintEndpoint:
    """The handler of `/hints`; `hint` makes the watches a hint names look soon and returns how many it hinted."""

    def __init__(self, token: HintToken, hint: Callable[[SourceHint], int], metrics: Metrics, *, warm_ms: int) -> None:
        self._token = token
        self._hint = hint
        self._warm_ms = warm_ms
        self._outcomes = {outcome: metrics.hints_received.labels(outcome) for outcome in HINT_OUTCOMES}

    async def serve(self, request: web.Request) -> web.Response:
        if request.method != "POST":
            return _error(405, "use POST", Allow="POST")
        if not self._token.accepts(request.headers.get("Authorization")):
            self._outcomes["unauthorized"].inc()
            return _error(401, "a missing or wrong bearer token", **{"WWW-Authenticate": "Bearer"})
        raw = await _body(request)
        if raw is None:
            self._outcomes["too_large"].inc()
            return _error(413, f"the body is over {MAX_BODY_BYTES} bytes")
        try:
            hint = parse_hint(raw)
        except BadHint as exc:
            self._outcomes["bad_request"].inc()
            return _error(400, str(exc))
        self._outcomes["accepted"].inc()
        return web.json_response({"hinted": self._hint(hint), "warm_ms": self._warm_ms}, status=202)
