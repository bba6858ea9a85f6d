"""What the rules of the upstream's own notification streams (`sidecar.watch.native_rules`) hear and ask for.

Events come from the registry (a context holds or drops a key), from the upstream (a notification a child sent on
its own), and from each stream's driver (what its last step came to). Commands are either effects, carried out at
once and synchronously by `NativeNotifications` (a hint, a key's coverage, a metric, a stream's task started or
cancelled), or a stream's next step, which its driver (`NativeStream`) awaits and answers with the event it came
to. A stream's batch of commands holds at most one step, last. Plain frozen values, so a test expects exact lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sidecar.changes import WatchKey, WatchKind
from sidecar.identity import Identity
from sidecar.protocol.errors import UpstreamError
from sidecar.protocol.types import JsonObject

__all__ = [
    "Acknowledged",
    "Began",
    "Command",
    "CoverKey",
    "Debounce",
    "Debounced",
    "Dropped",
    "Effect",
    "Event",
    "Finish",
    "Heard",
    "Held",
    "HintKey",
    "HintWatching",
    "LimitHit",
    "Listen",
    "Log",
    "OpenSession",
    "Probe",
    "Probed",
    "Received",
    "Retry",
    "RetryDue",
    "SessionOpened",
    "Start",
    "Step",
    "Stop",
    "Stopped",
    "StreamCrashed",
    "StreamEnded",
    "StreamFailed",
    "StreamsOpen",
    "Subscribe",
    "SubscribeAnswered",
    "Unsolicited",
    "Unsubscribe",
    "Unsubscribed",
    "Wait",
    "Wake",
    "Woken",
]

# -- events: from the registry and the upstream -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Held:
    """`identity` now watches (kind, uri); `capabilities`: what the upstream declares now (empty while unknown)."""

    identity: Identity
    kind: WatchKind
    uri: str | None
    capabilities: JsonObject = field(hash=False)


@dataclass(frozen=True, slots=True)
class Dropped:
    """`context` no longer watches (kind, uri)."""

    context: str
    kind: WatchKind
    uri: str | None


@dataclass(frozen=True, slots=True)
class Unsolicited:
    """A notification the upstream sent on its own (a child process's stdout); `modern`: its era is 2026-07-28."""

    message: JsonObject = field(hash=False)
    modern: bool


# -- events: what a stream's step came to --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Began:
    """The stream's task runs."""

    stream: int


@dataclass(frozen=True, slots=True)
class Probed:
    """The upstream's era and capabilities, probed afresh for the stream (answers `Probe`)."""

    stream: int
    modern: bool
    capabilities: JsonObject = field(hash=False)


@dataclass(frozen=True, slots=True)
class Acknowledged:
    """A listen is open, its first message `ack`, and the listen it replaces closed (answers `Listen`)."""

    stream: int
    ack: JsonObject = field(hash=False)


@dataclass(frozen=True, slots=True)
class SessionOpened:
    """The context session's GET stream is open (answers `OpenSession`)."""

    stream: int


@dataclass(frozen=True, slots=True)
class SubscribeAnswered:
    """`resources/subscribe` for `uri` was answered (`ok`), or refused with a JSON-RPC error."""

    stream: int
    uri: str
    ok: bool


@dataclass(frozen=True, slots=True)
class Unsubscribed:
    """`resources/unsubscribe` for `uri` was sent (whatever came of it)."""

    stream: int
    uri: str


@dataclass(frozen=True, slots=True)
class Woken:
    """The stream's wait was woken by a `Wake` (its stream still open)."""

    stream: int


@dataclass(frozen=True, slots=True)
class Debounced:
    """The pause after a change is over; `capabilities`: what the upstream declares now."""

    stream: int
    capabilities: JsonObject = field(hash=False)


@dataclass(frozen=True, slots=True)
class RetryDue:
    """The backoff after a failure is over."""

    stream: int


@dataclass(frozen=True, slots=True)
class Heard:
    """A message on the stream's open stream (any listen of it, or its session stream)."""

    stream: int
    message: JsonObject = field(hash=False)


@dataclass(frozen=True, slots=True)
class StreamEnded:
    """The upstream closed the stream (before its acknowledgment or after), everything open is closed."""

    stream: int


@dataclass(frozen=True, slots=True)
class StreamFailed:
    """A step failed with `error`, everything open is closed."""

    stream: int
    error: UpstreamError = field(hash=False)


@dataclass(frozen=True, slots=True)
class StreamCrashed:
    """A step raised what no upstream raises (a bug, logged where it was caught), everything open is closed."""

    stream: int


@dataclass(frozen=True, slots=True)
class Stopped:
    """The stream's task is over (finished or cancelled), everything open closed."""

    stream: int


Event = (
    Held
    | Dropped
    | Unsolicited
    | Began
    | Probed
    | Acknowledged
    | SessionOpened
    | SubscribeAnswered
    | Unsubscribed
    | Woken
    | Debounced
    | RetryDue
    | Heard
    | StreamEnded
    | StreamFailed
    | StreamCrashed
    | Stopped
)

# -- effects: carried out at once ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start:
    """Start stream `stream`'s task, for `identity`'s context."""

    stream: int
    identity: Identity


@dataclass(frozen=True, slots=True)
class Stop:
    """Cancel stream `stream`'s task (shutdown still waits for it to close)."""

    stream: int


@dataclass(frozen=True, slots=True)
class Wake:
    """What stream `stream`'s context holds changed: its wait, if it waits, ends."""

    stream: int


@dataclass(frozen=True, slots=True)
class HintKey:
    """`key`'s watch, if there is one, looks soon; `warm`: the upstream announced a change."""

    key: WatchKey
    warm: bool


@dataclass(frozen=True, slots=True)
class HintWatching:
    """Every context's watch of (kind, uri) looks soon, kept warm (a child's own announcement)."""

    kind: WatchKind
    uri: str | None


@dataclass(frozen=True, slots=True)
class CoverKey:
    """`key`'s watch, if there is one, is covered by the upstream's notifications (`native`) or not."""

    key: WatchKey
    native: bool


@dataclass(frozen=True, slots=True)
class StreamsOpen:
    """The open streams' gauge moves by `delta`."""

    delta: int


@dataclass(frozen=True, slots=True)
class Received:
    """The upstream sent a notification with `method` that names a change."""

    method: str


@dataclass(frozen=True, slots=True)
class LimitHit:
    """A context was refused a stream: `max_native_streams` are open."""


@dataclass(frozen=True, slots=True)
class Log:
    """Log `message` at info level, with `reason` (the error's)."""

    message: str
    reason: str


# -- steps: awaited by the stream's driver, answered by an event -----------------------------------------------


@dataclass(frozen=True, slots=True)
class Probe:
    """Learn the upstream's era and capabilities (`Probed`)."""

    stream: int


@dataclass(frozen=True, slots=True)
class Listen:
    """2026-07-28: open a listen with filter `wanted`, wait for its acknowledgment, then close the listen it replaces
    (`Acknowledged`, `StreamEnded` before the acknowledgment, `StreamFailed` without one in time)."""

    stream: int
    wanted: JsonObject = field(hash=False)


@dataclass(frozen=True, slots=True)
class OpenSession:
    """2025-11-25: open the context session's GET stream (`SessionOpened`)."""

    stream: int


@dataclass(frozen=True, slots=True)
class Subscribe:
    """`resources/subscribe` to `uri` on the context's session (`SubscribeAnswered`)."""

    stream: int
    uri: str


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """`resources/unsubscribe` from `uri`, its failure ignored (`Unsubscribed`)."""

    stream: int
    uri: str


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait until a `Wake` (`Woken`) or the open stream ends (`StreamEnded`, `StreamFailed`)."""

    stream: int


@dataclass(frozen=True, slots=True)
class Debounce:
    """Pause `seconds` after a change, so a burst becomes one new listen (`Debounced`)."""

    stream: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Retry:
    """Close what is open, then wait `seconds` before trying again (`RetryDue`)."""

    stream: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Finish:
    """The stream's task ends (closing what is open; `Stopped` follows)."""

    stream: int


Effect = Start | Stop | Wake | HintKey | HintWatching | CoverKey | StreamsOpen | Received | LimitHit | Log
Step = Probe | Listen | OpenSession | Subscribe | Unsubscribe | Wait | Debounce | Retry | Finish
Command = Effect | Step
