"""The metrics' label values and histogram buckets: small fixed sets, so every series exists from the start and a
label can never carry a client's text."""

from __future__ import annotations

from sidecar.protocol import LIST_KIND_OF_METHOD, LIST_KINDS, RESOURCE_UPDATED_METHOD

__all__ = [
    "END_REASONS",
    "HINT_OUTCOMES",
    "INTERVAL_BUCKETS",
    "KNOWN_METHODS",
    "LATENCY_BUCKETS",
    "LIMITS",
    "NOTIFICATION_METHODS",
    "POLL_OUTCOMES",
    "QUEUES",
    "RESTART_REASONS",
    "STDERR_OUTCOMES",
    "TOOL_CALL_DECISIONS",
    "WATCH_KINDS",
]

KNOWN_METHODS = frozenset(
    {
        "server/discover",
        "subscriptions/listen",
        *LIST_KIND_OF_METHOD,
        "tools/call",
        "prompts/get",
        "resources/read",
        "completion/complete",
        "initialize",
        "ping",
        "probe",
        "legacy-session",
    }
)
WATCH_KINDS = ("resource", *LIST_KINDS)
NOTIFICATION_METHODS = (RESOURCE_UPDATED_METHOD, *(row.notification_method for row in LIST_KINDS.values()))
POLL_OUTCOMES = ("ok", "error")
LIMITS = (
    "max_streams",
    "max_uris_per_stream",
    "max_sessions",
    "max_sessions_per_client",
    "native_streams",
    "max_connections",
    "queued_per_client",
    "queued_new_credentials",
    "queue_wait",
    "baseline_wait",
    "upstream_max_in_flight",
    "upstream_max_response_bytes",
)
QUEUES = ("upstream_requests", "poll_concurrency", "hinted_polls", "read_budget")
RESTART_REASONS = ("exited", "unresponsive", "handshake_failed", "start_failed")
STDERR_OUTCOMES = ("logged", "dropped")
HINT_OUTCOMES = ("accepted", "unauthorized", "bad_request", "too_large")
"""How a `POST /hints` was answered: 202, 401, 400, 413."""
TOOL_CALL_DECISIONS = (
    ("revalidate", "annotation"),
    ("revalidate", "rule"),
    ("revalidate", "unknown"),
    ("read_only", "annotation"),
    ("read_only", "rule"),
)
"""(decision, reason) of a forwarded `tools/call`: whether it made the watches look, and what said so (the tool's
entry in a tools list, a `revalidate.tools` rule, or nothing: a tool not seen in a tools list)."""
END_REASONS = ("client", "shutdown", "auth", "max_age", "stalled", "refused", "moved")

INTERVAL_BUCKETS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
