"""Watches: how change is seen (fingerprints), one look at the upstream, the engine and its driver (the registry).

What is watched (`WatchKey`), the change event and the coordination contract live below this package, in
`sidecar.changes`, where the buses use them too.
"""

from __future__ import annotations

from sidecar.watch.fingerprint import ABSENT, fingerprint_contents, fingerprint_items
from sidecar.watch.observation import Observation, is_not_found, observation_from_read
from sidecar.watch.observe import observe
from sidecar.watch.registry import Handle, WatchRegistry
from sidecar.watch.schedule import Schedule

__all__ = [
    "ABSENT",
    "Handle",
    "Observation",
    "Schedule",
    "WatchRegistry",
    "fingerprint_contents",
    "fingerprint_items",
    "is_not_found",
    "observation_from_read",
    "observe",
]
