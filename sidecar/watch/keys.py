"""What a watch watches: a kind, a URI for resources, and the partition whose view it is."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from sidecar.protocol.constants import LIST_CHANGED_METHODS, RESOURCE_UPDATED_METHOD

__all__ = ["LIST_KINDS", "WatchKey", "WatchKind"]

WatchKind = Literal["resource", "resources_list", "tools_list", "prompts_list"]

LIST_KINDS: tuple[WatchKind, ...] = ("resources_list", "tools_list", "prompts_list")


@dataclass(frozen=True, slots=True)
class WatchKey:
    """One polled thing. `partition` is `public` or an authorization context id (never a credential)."""

    kind: WatchKind
    uri: str | None
    partition: str

    @property
    def notification_method(self) -> str:
        """The notification a change of this key sends."""
        return RESOURCE_UPDATED_METHOD if self.kind == "resource" else LIST_CHANGED_METHODS[self.kind]

    @property
    def short_hash(self) -> str:
        """A short stable name for logs and the status page; says nothing about the URI or the context."""
        text = f"{self.kind}\0{self.uri or ''}\0{self.partition}"
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
