"""What the upstream's notification messages say, for the rules of its streams (`sidecar.watch.native_rules`):
what it declares it can push, the filter a 2026-07-28 listen asks for, what its acknowledgment honoured, the key a
notification names, and the refusals that mean it serves no stream at all.
"""

from __future__ import annotations

from collections.abc import Iterable

from sidecar.changes import WatchKind
from sidecar.protocol.constants import RESOURCE_UPDATED_METHOD
from sidecar.protocol.errors import UpstreamError, UpstreamHTTPError, UpstreamRpcError
from sidecar.protocol.lists import LIST_KIND_OF_NOTIFICATION, LIST_KINDS
from sidecar.protocol.types import JsonObject

__all__ = ["FILTER_FIELDS", "Key", "capability", "honoured", "listen_filter", "named_change", "unsupported"]

FILTER_FIELDS: dict[WatchKind, tuple[str, str]] = {
    row.kind: (row.filter_field, row.primitive) for row in LIST_KINDS.values()
}
Key = tuple[WatchKind, str | None]
"""A key as a stream covers it: (kind, uri), the uri None for a list."""
_ACK = "notifications/subscriptions/acknowledged"
_KIND_OF_METHOD: dict[str, WatchKind] = dict(LIST_KIND_OF_NOTIFICATION)


def capability(capabilities: JsonObject, primitive: str, flag: str) -> bool:
    value = capabilities.get(primitive)
    return isinstance(value, dict) and value.get(flag) is True


def listen_filter(uris: Iterable[str], lists: Iterable[WatchKind], capabilities: JsonObject) -> JsonObject:
    """A listen's filter: what the context holds that the upstream declares it can push."""
    wanted: JsonObject = {}
    for kind in lists:
        field, primitive = FILTER_FIELDS[kind]
        if capability(capabilities, primitive, "listChanged"):
            wanted[field] = True
    subscriptions = sorted(uris)
    if subscriptions and capability(capabilities, "resources", "subscribe"):
        wanted["resourceSubscriptions"] = subscriptions
    return wanted


def honoured(ack: JsonObject) -> frozenset[Key]:
    """The keys a listen's first message acknowledged (none if it is no acknowledgment)."""
    params = ack.get("params")
    notifications = params.get("notifications") if isinstance(params, dict) else None
    if ack.get("method") != _ACK or not isinstance(notifications, dict):
        return frozenset()
    subscriptions = notifications.get("resourceSubscriptions", [])
    keys: set[Key] = {("resource", uri) for uri in subscriptions if isinstance(uri, str)}
    keys.update((kind, None) for kind, (field, _) in FILTER_FIELDS.items() if notifications.get(field) is True)
    return frozenset(keys)


def named_change(message: JsonObject) -> tuple[str, WatchKind, str | None] | None:
    """The method of a notification and the key it says changed, if it names one."""
    method = message.get("method")
    params = message.get("params")
    params = params if isinstance(params, dict) else {}
    if method == RESOURCE_UPDATED_METHOD and isinstance(params.get("uri"), str):
        return method, "resource", params["uri"]
    if isinstance(method, str) and method in _KIND_OF_METHOD:
        return method, _KIND_OF_METHOD[method], None
    return None


def unsupported(exc: UpstreamError) -> bool:
    """No GET stream (405), or no listen (-32601 / 404): the upstream cannot push; ask once, not forever."""
    if isinstance(exc, UpstreamHTTPError):
        return exc.status in (404, 405)
    return isinstance(exc, UpstreamRpcError) and exc.code == -32601
