"""The watch engine, sans I/O: events in, commands out (`Engine.handle(event, now)`), and nothing awaited.

The registry (`sidecar.watch.registry`) is its one driver. As in mitmproxy's proxy core, the rules live where no
socket, task or timer can interleave with them, and their tests are playbooks: feed events, expect commands. This
is the engine's face: its events, its commands, and how others see a watch (`views`), the one writer of whose state
is the engine.
"""

from __future__ import annotations

from sidecar.watch.engine.commands import (
    BudgetShare,
    CancelTimer,
    Command,
    Cover,
    Fail,
    HintWrite,
    Interval,
    Observed,
    Publish,
    PublishFirst,
    Resolve,
    Revoke,
    SetTimer,
    StartLook,
    StartPoll,
    StartWatch,
    StopWatch,
    Track,
    Uncover,
    Untrack,
    Waited,
)
from sidecar.watch.engine.core import Engine
from sidecar.watch.engine.events import (
    ChangeHeard,
    Covered,
    Event,
    Forwarded,
    Hinted,
    Leave,
    LookDone,
    LookFailed,
    PollCrashed,
    PollDone,
    PollFailed,
    PollFinished,
    PollSkipped,
    Published,
    Recovered,
    Refused,
    Release,
    Subscribe,
    TimerFired,
)
from sidecar.watch.engine.evidence import teaches
from sidecar.watch.engine.record import Record, Stage
from sidecar.watch.engine.views import CoordinatorView, WatchSummary

__all__ = [
    "BudgetShare",
    "CancelTimer",
    "ChangeHeard",
    "Command",
    "CoordinatorView",
    "Cover",
    "Covered",
    "Engine",
    "Event",
    "Fail",
    "Forwarded",
    "HintWrite",
    "Hinted",
    "Interval",
    "Leave",
    "LookDone",
    "LookFailed",
    "Observed",
    "PollCrashed",
    "PollDone",
    "PollFailed",
    "PollFinished",
    "PollSkipped",
    "Publish",
    "PublishFirst",
    "Published",
    "Record",
    "Recovered",
    "Refused",
    "Release",
    "Resolve",
    "Revoke",
    "SetTimer",
    "Stage",
    "StartLook",
    "StartPoll",
    "StartWatch",
    "StopWatch",
    "Subscribe",
    "TimerFired",
    "Track",
    "Uncover",
    "Untrack",
    "Waited",
    "WatchSummary",
    "teaches",
]
