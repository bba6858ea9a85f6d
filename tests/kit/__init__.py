"""The test kit: one of each thing the tests need to talk to a sidecar, so no test writes its own.

- `wire`: the protocol constants and request builders (headers, `request`, `listen_request`, `rpc`);
- `sse`: the one SSE parser (`SseParser`, `sse_messages` for a live answer, `parse_sse` for a whole body);
- `listen`: the one listen-stream client (`ListenStream`, `listening`, `Streams`, `all_updated`);
- `metrics`: the one `/metrics` scrape (`scrape`, `parse`, `Scrape`);
- `waiting`: the one waiting helper (`eventually`), for state with no event to await;
- `loop_thread`: the one threaded-loop harness (`loop_thread`, `World`), for a world that lives across hypothesis
  examples;
- `cli`: the one CLI-process helper (`cli`, `Cli`);
- `serving`: the sidecar app served in the test's own process (`serve_sidecar`, `serve_config`);
- `told`: the log line that says what a client's upstream error id stands for (`told`);
- `sync_process`: a server process driven without an event loop, for a hypothesis property (not re-exported).
- `session`: the one raw 2025-11-25 session client (`Session`, `sessions`), its GET stream read as frames arrive (not
  re-exported).
- `partition_proxy`: a TCP proxy that can hold every byte both ways without closing (`PartitionProxy`,
  `partition_proxy`), a partition between a replica and Redis or the upstream (not re-exported).

Everything is re-exported here: `from tests.kit import ListenStream, eventually, rpc`.
"""

from __future__ import annotations

from tests.kit.cli import Cli, cli, cli_env
from tests.kit.listen import ListenStream, Streams, all_updated, listening
from tests.kit.loop_thread import LoopThread, World, loop_thread
from tests.kit.metrics import Sample, Scrape, parse, scrape
from tests.kit.serving import Sidecar, context_of, make_config, serve_config, serve_sidecar, waits
from tests.kit.sse import COMMENT, SseParser, parse_sse, sse_messages
from tests.kit.told import TOLD_LINE, told
from tests.kit.waiting import WAIT_S, eventually
from tests.kit.wire import (
    ACK,
    LEGACY_HEADERS,
    LEGACY_INITIALIZE,
    META,
    PROMPTS_CHANGED,
    PV,
    RESOURCES_CHANGED,
    SUB_ID_KEY,
    TOOLS_CHANGED,
    UPDATED,
    headers,
    listen_request,
    read_resource,
    readyz,
    request,
    rpc,
    text_of,
)

__all__ = [
    "ACK",
    "COMMENT",
    "LEGACY_HEADERS",
    "LEGACY_INITIALIZE",
    "META",
    "PROMPTS_CHANGED",
    "PV",
    "RESOURCES_CHANGED",
    "SUB_ID_KEY",
    "TOLD_LINE",
    "TOOLS_CHANGED",
    "UPDATED",
    "WAIT_S",
    "Cli",
    "ListenStream",
    "LoopThread",
    "Sample",
    "Scrape",
    "Sidecar",
    "SseParser",
    "Streams",
    "World",
    "all_updated",
    "cli",
    "cli_env",
    "context_of",
    "eventually",
    "headers",
    "listen_request",
    "listening",
    "loop_thread",
    "make_config",
    "parse",
    "parse_sse",
    "read_resource",
    "readyz",
    "request",
    "rpc",
    "scrape",
    "serve_config",
    "serve_sidecar",
    "sse_messages",
    "text_of",
    "told",
    "waits",
]
