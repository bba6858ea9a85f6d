"""What the requests the sidecar forwards, and the polls the upstream refuses, teach the watches.

A write may have changed data: the watches it may concern are hinted. A read shows content: a watched
resource's answer is a look (ticketed as the request started), a not-found the reader's own watch's absence. A
refusal (401/403), of a read or of a poll, ends the subscriptions of the context refused (Revoke), which must
prove access again with a read of its own before it rejoins. Rules only: each returns the commands it implies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from sidecar.changes import WatchKey
from sidecar.identity import PUBLIC, Identity
from sidecar.protocol import READ_ONLY_METHODS, JsonObject
from sidecar.watch.admission import Admission
from sidecar.watch.engine.commands import Command, Revoke
from sidecar.watch.engine.events import Forwarded
from sidecar.watch.engine.record import Record
from sidecar.watch.fingerprint import ABSENT
from sidecar.watch.observation import Observation, observation_from_read
from sidecar.watch.rules import Rules

__all__ = ["Apply", "Evidence", "Write", "teaches"]

Apply = Callable[[Record, Observation, int], list[Command]]
"""Offers a look (started at a ticket) to a watch: the engine's rule for looks (`Watching.apply`)."""
Write = Callable[[str, Any], list[Command]]
"""A request of a context that may have written went through, with its traced span (the engine's write debounce)."""


def teaches(method: str) -> bool:
    """Whether a forwarded `method` can teach the watches anything: a write, or a read of a resource. (Asked before
    an event is made: every other forwarded request, the bulk of them, costs the engine nothing.)"""
    return method not in READ_ONLY_METHODS or method == "resources/read"


class Evidence:
    """Forwarded answers and refusals, turned into commands for the watches they concern."""

    def __init__(
        self, records: Mapping[WatchKey, Record], admission: Admission, rules: Rules, apply: Apply, wrote: Write
    ) -> None:
        self._records = records
        self._apply = apply
        self._wrote = wrote
        self._admission = admission
        self._rules = rules

    def forwarded(self, event: Forwarded) -> list[Command]:
        """A forwarded request taught us something: a write may have changed data; a read shows content."""
        method, params, identity, answer = event.method, event.params, event.identity, event.answer
        if method not in READ_ONLY_METHODS:
            return self._wrote(identity.context, event.link)
        if not teaches(method) or not isinstance(params.get("uri"), str):
            return []
        uri = params["uri"]
        result = answer.get("result")
        if isinstance(result, dict):
            self._admission.present(uri, identity.context)
            scope = PUBLIC if result.get("cacheScope") == "public" else identity.context
            key = WatchKey("resource", uri, scope)
            record = self._records.get(key)
            if record is not None:  # fingerprint only what someone watches: this is the forwarding hot path
                with contextlib.suppress(ValueError):  # unfingerprintable content teaches nothing
                    return self._apply(record, observation_from_read(result, self._rules.for_uri(uri)), event.ticket)
            return []
        error = answer.get("error")
        if isinstance(error, dict) and error.get("code") in (-32602, -32002):
            # Only this context's own watch: a resource hidden from one user is not gone for everyone.
            record = self._records.get(WatchKey("resource", uri, identity.context))
            if record is not None:
                return self._apply(record, Observation(ABSENT, None, False), event.ticket)
        return []

    def refused(self, method: str, params: JsonObject, identity: Identity) -> list[Command]:
        """The upstream refused `identity` a forwarded request (401/403). A refused read of a URI the context
        watches ends its subscription to it, even when the watch is public and polled with someone else's
        credential, which the upstream still accepts."""
        uri = params.get("uri")
        if method != "resources/read" or not isinstance(uri, str):
            return []
        commands: list[Command] = []
        for context in (PUBLIC, identity.context):
            key = WatchKey("resource", uri, context)
            record = self._records.get(key)
            if record is not None:
                record.verified.discard(identity.context)  # it must prove access again before rejoining
                commands.append(Revoke(key, identity.context))
        return commands

    def poll_refused(self, key: WatchKey, context: str) -> list[Command]:
        """A poll of `key` with `context`'s credential was refused (401/403)."""
        record = self._records.get(key)
        if record is None:
            return []
        # Only the context whose credential was refused: a public key is polled with one context's credential,
        # and the other contexts' credentials are as good as before (their streams must not end).
        record.verified.discard(context)  # it must prove access again with its own read before rejoining
        return [Revoke(key, context)]
