"""The stdio peers behave as the sidecar tests assume (the SDK's own stdio client straight at them)."""

from __future__ import annotations

import asyncio
import sys
import warnings
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPDeprecationWarning

from tests.peers.stdio_notes_server import NOTE_URI
from tests.peers.stdio_peers import REPO_ROOT, memory_command


def _params(module: str, *args: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", module, *args], cwd=str(REPO_ROOT))


async def test_the_notes_server_reads_its_file_as_it_is_now(tmp_path: Path) -> None:
    note = tmp_path / "note.txt"
    note.write_text("first", encoding="utf-8")
    async with Client(_params("tests.peers.stdio_notes_server", "--file", str(note)), cache=None) as client:
        assert client.protocol_version == "2026-07-28"
        assert (await client.read_resource(NOTE_URI)).contents[0].text == "first"  # type: ignore[union-attr]
        note.write_text("behind its back", encoding="utf-8")
        assert (await client.read_resource(NOTE_URI)).contents[0].text == "behind its back"  # type: ignore[union-attr]
        await client.call_tool("write_note", {"text": "through a tool"})
    assert note.read_text(encoding="utf-8") == "through a tool"


async def test_the_toy_server_speaks_only_2025_11_25() -> None:
    async with Client(_params("tests.peers.stdio_toy_server"), cache=None) as client:
        assert client.protocol_version == "2025-11-25"
        echoed = await client.call_tool("echo", {"text": "hi"})
        assert echoed.content[0].text == "hi"  # type: ignore[union-attr]


async def test_server_memory_announces_its_graph_after_every_writing_call_even_one_that_changed_nothing(
    tmp_path: Path,
) -> None:
    # What tests/compat/test_memory_server.py's unchanged-graph pin relies on: the server's own false alarm.
    announced: asyncio.Queue[str] = asyncio.Queue()

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/resources/updated":
            announced.put_nowait(str(message.params.uri))

    node, script = memory_command()
    params = StdioServerParameters(command=node, args=[script], env={"MEMORY_FILE_PATH": str(tmp_path / "m.jsonl")})
    ada = {"name": "Ada", "entityType": "person", "observations": []}
    async with Client(params, mode="legacy", cache=None, message_handler=on_message) as client:
        assert client.server_capabilities.resources is not None and client.server_capabilities.resources.subscribe
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await client.subscribe_resource("memory://knowledge-graph")
        first = await client.call_tool("create_entities", {"entities": [ada]})
        again = await client.call_tool("create_entities", {"entities": [ada]})
        async with asyncio.timeout(10):
            assert [await announced.get(), await announced.get()] == ["memory://knowledge-graph"] * 2
    assert first.structured_content == {"entities": [ada]} and again.structured_content == {"entities": []}
