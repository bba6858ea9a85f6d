"""What the requests the sidecar forwards, and the polls the upstream refuses, teach the watches.

A write may have changed data: the watches it may concern are hinted. A read shows content: a watched
resource's answer is a look (ticketed as the request started), a not-found the reader's own watch's absence. A
refusal (401/403), of a read or of a poll, ends the subscriptions of the context refused (through the
auth-failure listeners), which must prove access again with a read of its own before it rejoins.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from sidecar.changes import WatchKey
from sidecar.identity import PUBLIC, Identity
from sidecar.protocol.constants import READ_ONLY_METHODS
from sidecar.protocol.errors import UpstreamHTTPError
from sidecar.watch.admission import Admission
from sidecar.watch.fingerprint import ABSENT
from sidecar.watch.observe import Observation, observation_from_read
from sidecar.watch.poller import Watch
from sidecar.watch.rules import Rules

__all__ = ["AuthFailureListener", "Evidence"]

JsonObject = dict[str, Any]

AuthFailureListener = Callable[[WatchKey, str], None]
"""Told that a context's credential was refused while polling a key (its streams should end)."""


class Evidence:
    """Forwarded answers and refusals, applied to the watches they concern."""

    def __init__(
        self,
        *,
        watch_of: Callable[[WatchKey], Watch | None],
        apply: Callable[[Watch, Observation, int], None],
        admission: Admission,
        rules: Rules,
        revalidate: Callable[[Identity], None],
        last_poller: Callable[[WatchKey], str | None],
    ) -> None:
        self._watch = watch_of
        self._apply = apply
        self._admission = admission
        self._rules = rules
        self._revalidate = revalidate
        self._last_poller = last_poller
        self._auth_listeners: list[AuthFailureListener] = []

    def on_auth_failure(self, listener: AuthFailureListener) -> None:
        self._auth_listeners.append(listener)

    def after_forward(
        self, method: str, params: JsonObject, identity: Identity, answer: JsonObject, ticket: int
    ) -> None:
        """A forwarded request taught us something: a write may have changed data; a read shows content."""
        if method not in READ_ONLY_METHODS:
            self._revalidate(identity)
            return
        if method != "resources/read" or not isinstance(params.get("uri"), str):
            return
        uri = params["uri"]
        result = answer.get("result")
        if isinstance(result, dict):
            self._admission.present(uri, identity.context)
            scope = PUBLIC if result.get("cacheScope") == "public" else identity.context
            watch = self._watch(WatchKey("resource", uri, scope))
            if watch is not None:  # fingerprint only what someone watches: this is the forwarding hot path
                with contextlib.suppress(ValueError):  # unfingerprintable content teaches nothing
                    self._apply(watch, observation_from_read(result, self._rules.for_uri(uri)), ticket)
            return
        error = answer.get("error")
        if isinstance(error, dict) and error.get("code") in (-32602, -32002):
            # Only this context's own watch: a resource hidden from one user is not gone for everyone.
            watch = self._watch(WatchKey("resource", uri, identity.context))
            if watch is not None:
                self._apply(watch, Observation(ABSENT, None, False), ticket)

    def refused(self, method: str, params: JsonObject, identity: Identity) -> None:
        """The upstream refused `identity` a forwarded request (401/403). A refused read of a URI the context
        watches ends its subscription to it, even when the watch is public and polled with someone else's
        credential, which the upstream still accepts."""
        uri = params.get("uri")
        if method != "resources/read" or not isinstance(uri, str):
            return
        for context in (PUBLIC, identity.context):
            key = WatchKey("resource", uri, context)
            watch = self._watch(key)
            if watch is not None:
                watch.verified.discard(identity.context)  # it must prove access again before rejoining
                for listener in self._auth_listeners:
                    listener(key, identity.context)

    def poll_refused(self, watch: Watch, error: UpstreamHTTPError) -> None:
        """A poll of `watch` was refused (401/403)."""
        # Only the context whose credential was refused: a public key is polled with one context's credential,
        # and the other contexts' credentials are as good as before (their streams must not end).
        context = watch.key.context if watch.key.context != PUBLIC else self._last_poller(watch.key)
        if context is None:
            return
        watch.verified.discard(context)  # it must prove access again with its own read before rejoining
        for listener in self._auth_listeners:
            listener(watch.key, context)
