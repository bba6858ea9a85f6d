"""Values that are each valid but contradict one another: the configuration loads, one of them silently wins, and
the operator should hear which. Told by `check-config` and at start as warnings naming both keys (by the
environment variable that set a key, where one did) and what applies.
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar.config.sections import PollingConfig

__all__ = ["polling_contradictions"]

KeyName = Callable[[str], str]
"""A dotted key (`polling.min_interval_ms`) -> how a warning names it (with the variable that set it, if any)."""


def _interval_clamped(name: KeyName, key: str, value: int, polling: PollingConfig, applies_to: str) -> list[str]:
    # The schedule clamps every interval to [min_interval_ms, max_interval_ms]: a value outside is never used.
    if value < polling.min_interval_ms:
        bound, applied = "polling.min_interval_ms", polling.min_interval_ms
        relation = "below"
    elif value > polling.max_interval_ms:
        bound, applied = "polling.max_interval_ms", polling.max_interval_ms
        relation = "above"
    else:
        return []
    return [
        f"{name(key)} is {value}, {relation} {name(bound)} of {applied}: {applies_to} are polled every {applied} ms"
    ]


def polling_contradictions(polling: PollingConfig, name: KeyName) -> list[str]:
    """The polling section's intervals that the schedule's clamp overrides, each saying what applies instead."""
    warnings = _interval_clamped(
        name, "polling.default_interval_ms", polling.default_interval_ms, polling, "resources without a ttlMs"
    )
    for index, rule in enumerate(polling.rules):
        if rule.interval_ms is not None:
            warnings += _interval_clamped(
                name, f"polling.rules[{index}].interval_ms", rule.interval_ms, polling, f"URIs matching {rule.match!r}"
            )
    return warnings
