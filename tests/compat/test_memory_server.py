"""`@modelcontextprotocol/server-memory` (npm, stdio, Node 22) as the sidecar's stdio child: a knowledge graph
kept in a JSONL file, changed for real through its own tool and by writing the file behind its back.

What a client can watch: one resource, `memory://knowledge-graph` (the whole graph as JSON). The server
declares `resources.subscribe` (and `listChanged` for tools and resources, though neither list ever changes)
and announces `resources/updated` of the graph after each of its writing tools, even when the call changed
nothing (creating an entity that exists saves the graph again, unchanged). A write to the file by anyone else
it never announces: only the sidecar's poll sees that.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.app import METRICS, UPSTREAM
from tests.compat.clients import SdkMode, text_of, watching
from tests.compat.upstreams import (
    OUT_OF_BAND_POLLING,
    OUT_OF_BAND_WITHIN_S,
    SLOW_POLLING,
    TOOL_CHANGE_WITHIN_S,
    record_latency,
)
from tests.kit import ListenStream, Sidecar, eventually, rpc
from tests.peers.stdio_peers import MEMORY_VERSION, installed_version, memory_command, serve_stdio_sidecar

pytestmark = pytest.mark.timeout(120)

MODES: list[SdkMode] = ["2026", "legacy"]
GRAPH = "memory://knowledge-graph"
ADA = {"name": "Ada", "entityType": "person", "observations": ["wrote the first program"]}
GRACE = {"name": "Grace", "entityType": "person", "observations": ["found a moth in the relay"]}


def graph(*entities: dict[str, Any]) -> dict[str, Any]:
    """The graph as the resource's JSON text reads, with `entities` and no relations."""
    return {"entities": list(entities), "relations": []}


def write_behind_its_back(path: Path, *entities: dict[str, Any]) -> None:
    """The graph file as the server writes it (one JSON object a line), written by someone else."""
    lines = [json.dumps({"type": "entity", **entity}) for entity in entities]
    path.write_text("\n".join(lines), encoding="utf-8")


@contextlib.asynccontextmanager
async def serve_memory(tmp_path: Path, polling: dict[str, int], *seed: dict[str, Any]) -> AsyncIterator[Sidecar]:
    """The sidecar with server-memory as its child, the graph file in `tmp_path` holding `seed`."""
    command = memory_command()
    assert installed_version(command) == MEMORY_VERSION, "not the version .ci/install-peers pins"
    memory_file = tmp_path / "memory.jsonl"
    write_behind_its_back(memory_file, *seed)
    async with serve_stdio_sidecar(
        command, upstream={"env": {"MEMORY_FILE_PATH": str(memory_file)}}, polling=polling
    ) as sidecar:
        yield sidecar


@pytest.mark.parametrize("mode", MODES)
async def test_an_entity_created_through_its_tool_is_heard_long_before_the_next_poll(
    mode: SdkMode, tmp_path: Path
) -> None:
    async with serve_memory(tmp_path, SLOW_POLLING) as sidecar, watching(sidecar.url, mode, GRAPH) as watch:
        info = sidecar.app[UPSTREAM].info
        assert info is not None and info.capabilities["resources"].get("subscribe") is True  # what this test relies on
        assert json.loads(await text_of(watch.client, GRAPH)) == graph()
        await watch.client.list_tools()  # the SDK lists tools before a tool's first call: not part of the timing
        started = asyncio.get_running_loop().time()
        await watch.client.call_tool("create_entities", {"entities": [ADA]})
        await watch.updated(TOOL_CHANGE_WITHIN_S)
        record_latency(f"server-memory sdk-{mode} via tool", asyncio.get_running_loop().time() - started)
        assert json.loads(await text_of(watch.client, GRAPH)) == graph(ADA)


@pytest.mark.parametrize("mode", MODES)
async def test_a_graph_written_behind_its_back_is_heard_within_one_poll_interval(mode: SdkMode, tmp_path: Path) -> None:
    async with (
        serve_memory(tmp_path, OUT_OF_BAND_POLLING, ADA) as sidecar,
        watching(sidecar.url, mode, GRAPH) as watch,
    ):
        assert json.loads(await text_of(watch.client, GRAPH)) == graph(ADA)
        write_behind_its_back(tmp_path / "memory.jsonl", ADA, GRACE)
        started = asyncio.get_running_loop().time()
        await watch.updated(OUT_OF_BAND_WITHIN_S)
        record_latency(f"server-memory sdk-{mode} file behind its back", asyncio.get_running_loop().time() - started)
        assert json.loads(await text_of(watch.client, GRAPH)) == graph(ADA, GRACE)


@pytest.mark.invariant(19)
@pytest.mark.invariant(22)
async def test_its_announcement_of_an_unchanged_graph_reaches_no_client(tmp_path: Path) -> None:
    # Creating Ada again changes nothing, yet the server announces an update and the call is a write: the
    # sidecar looks, finds the graph as it was, and tells nobody. Grace is the control: a real change, told.
    async with (
        serve_memory(tmp_path, SLOW_POLLING, ADA) as sidecar,
        aiohttp.ClientSession() as http,
    ):
        metrics = sidecar.app[METRICS]
        announced = metrics.upstream_notifications.labels("notifications/resources/updated")
        looks, found = metrics.polls.labels("resource", "ok"), metrics.changes.labels("resource")
        stream = await ListenStream.connect(http, sidecar.url, "memory-1", [GRAPH])
        try:
            mark, announced_before, looks_before = stream.mark(), announced._value.get(), looks._value.get()
            found_before = found._value.get()
            status, answer = await call(http, sidecar, "create_entities", {"entities": [ADA]})
            assert status == 200 and answer["result"]["structuredContent"] == {"entities": []}, answer  # nothing new
            await eventually(
                lambda: announced._value.get() > announced_before and looks._value.get() > looks_before,
                what="the server's announcement, and a look at the graph after the call",
            )
            # A look is counted just before what it saw is weighed, in one step: a change it found is counted now.
            assert found._value.get() == found_before, "the unchanged graph was taken for a change"
            status, answer = await call(http, sidecar, "create_entities", {"entities": [GRACE]})
            assert status == 200 and answer["result"]["structuredContent"] == {"entities": [GRACE]}, answer
            await stream.wait_update(GRAPH, TOOL_CHANGE_WITHIN_S, since=mark)
            assert found._value.get() == found_before + 1
            assert len(stream.updates(since=mark)) == 1, "the unchanged graph was told too"
        finally:
            await stream.close()


async def call(http: aiohttp.ClientSession, sidecar: Sidecar, tool: str, arguments: dict[str, Any]) -> tuple[int, Any]:
    """A 2026-07-28 tools/call through the sidecar: (HTTP status, the JSON-RPC answer)."""
    return await rpc(http, sidecar.url, "tools/call", {"name": tool, "arguments": arguments})
