"""The stdio peers behave as the sidecar tests assume (the SDK's own stdio client straight at them)."""

from __future__ import annotations

import sys
from pathlib import Path

from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.peers.stdio_notes_server import NOTE_URI
from tests.peers.stdio_peers import REPO_ROOT


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
