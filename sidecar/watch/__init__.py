"""Watches: what is polled (keys), how change is seen (fingerprints), who polls (coordination), and one look.

The poller (`sidecar.watch.poller`) and the registry (`sidecar.watch.registry`) are imported from their own
modules, not from here: they import `sidecar.bus`, which imports `sidecar.watch.keys`, so naming them here
would have importing the bus run into its own half-initialised module.
"""

from __future__ import annotations

from sidecar.watch.coordination import LocalCoordinator, PollCoordinator, WatchState
from sidecar.watch.fingerprint import ABSENT, fingerprint_contents, fingerprint_items
from sidecar.watch.keys import LIST_KINDS, WatchKey, WatchKind
from sidecar.watch.observe import Observation, is_not_found, observation_from_read, observe

__all__ = [
    "ABSENT",
    "LIST_KINDS",
    "LocalCoordinator",
    "Observation",
    "PollCoordinator",
    "WatchKey",
    "WatchKind",
    "WatchState",
    "fingerprint_contents",
    "fingerprint_items",
    "is_not_found",
    "observation_from_read",
    "observe",
]
