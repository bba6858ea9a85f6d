"""The README's "Put it in front of your server", run as written against a real upstream.

Each block the README marks with `<!-- readme-test: NAME -->` is taken from README.md as it is: the YAML is written
to `sidecar.yaml` and loaded by the check-config and run lines of the next block, the curl line opens a listen and
gets its ack and an update, and the SDK client is run as a script that re-reads after each update. Only the ports
are rewritten (the README's 9000, 8080 and the admin listener's 9464 become free ones, as the YAML's comment says),
and `mcp-sidecar` runs as `python -m sidecar.cli` of this checkout (the program the console script starts).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shlex
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from sidecar.demo.snippet import sdk_snippet
from tests.peers import Upstream, start_upstream
from tests.prereqs import require_binary
from tests.procs import REPO_ROOT, ServerProcess, child_env, free_port, http_answers

README = REPO_ROOT / "README.md"
_BLOCK = re.compile(r"<!-- readme-test: ([\w-]+) -->\n```\w*\n(.*?)\n```", re.DOTALL)
README_UPSTREAM_PORT = 9000
README_PORT = 8080
URI = "catalog://price"
WITHIN_S = 20.0
"""Bound on each awaited line; a change arrives within one polling interval (2 s in the README's YAML)."""


def readme_block(name: str) -> str:
    """The body of the fenced block the README marks `name`."""
    blocks = {found.group(1): found.group(2) for found in _BLOCK.finditer(README.read_text(encoding="utf-8"))}
    assert name in blocks, f"README.md has no block marked <!-- readme-test: {name} --> (it has {sorted(blocks)})"
    return blocks[name]


def _ported(text: str, ports: dict[int, int]) -> str:
    """`text` with the README's ports replaced by the test's (each must be there: the blocks agree on them)."""
    for old, new in ports.items():
        assert re.search(rf"\b{old}\b", text), f"expected port {old} in:\n{text}"
        text = re.sub(rf"\b{old}\b", str(new), text)
    return text


def _sidecar_argv(line: str) -> list[str]:
    """A README command line as argv, `mcp-sidecar` being this checkout's CLI."""
    argv = shlex.split(line, comments=True)
    assert argv[0] == "mcp-sidecar", line
    return [sys.executable, "-m", "sidecar.cli", *argv[1:]]


class _Output:
    """A process whose stdout is read line by line as it comes."""

    def __init__(self, proc: asyncio.subprocess.Process, what: str) -> None:
        self.proc = proc
        self.what = what
        self.lines: list[str] = []

    async def line(self, pattern: str) -> re.Match[str]:
        """The next line matching `pattern`; fails when the process ends first or after WITHIN_S."""
        assert self.proc.stdout is not None
        regex = re.compile(pattern)
        try:
            async with asyncio.timeout(WITHIN_S):
                while raw := await self.proc.stdout.readline():
                    text = raw.decode(errors="replace").rstrip("\r\n")
                    self.lines.append(text)
                    if found := regex.search(text):
                        return found
        except TimeoutError:
            pass
        pytest.fail(f"{self.what}: no line matching {pattern!r}; it printed:\n" + "\n".join(self.lines))


@contextlib.asynccontextmanager
async def _running(argv: Sequence[str], what: str, cwd: Path) -> AsyncIterator[_Output]:
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=child_env({"PYTHONPATH": str(REPO_ROOT)}),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield _Output(proc, what)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


@contextlib.asynccontextmanager
async def _the_readme_sidecar(tmp_path: Path) -> AsyncIterator[tuple[Upstream, int]]:
    """The README's YAML checked and run by its own command lines, in front of a 2025-11-25 server without
    subscriptions (the shop server, whose `catalog://price` is the README's resource); yields it and the port."""
    port = free_port()
    async with await start_upstream("legacy") as upstream:
        yaml = _ported(readme_block("quickstart-yaml"), {README_UPSTREAM_PORT: upstream.port, README_PORT: port})
        (tmp_path / "sidecar.yaml").write_text(yaml)
        check_line, run_line = readme_block("quickstart-run").splitlines()
        check = await asyncio.create_subprocess_exec(
            *_sidecar_argv(check_line), cwd=tmp_path, env=child_env({"PYTHONPATH": str(REPO_ROOT)}),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(check.communicate(), WITHIN_S)
        assert check.returncode == 0, err.decode()
        effective = json.loads(out)
        assert (effective["upstream"]["url"], effective["listen"]["port"]) == (upstream.url, port)
        run = ServerProcess(
            "mcp-sidecar run", _sidecar_argv(run_line), tmp_path / "sidecar.log",
            env={"PYTHONPATH": str(REPO_ROOT), "MCP_SIDECAR__ADMIN__PORT": str(free_port())}, cwd=tmp_path,
        )  # fmt: skip
        async with run.serving(http_answers(f"http://127.0.0.1:{port}/readyz")):
            yield upstream, port


async def test_the_readme_curl_listen_gets_its_ack_and_an_update(tmp_path: Path) -> None:
    require_binary("curl", needed_by="the README's curl listen")
    async with _the_readme_sidecar(tmp_path) as (upstream, port):
        command = ["bash", "-c", _ported(readme_block("quickstart-curl"), {README_PORT: port})]
        async with _running(command, "the README's curl listen", tmp_path) as curl:
            ack = json.loads((await curl.line(r"^data: (.*acknowledged.*)$")).group(1))
            assert ack["params"]["notifications"] == {"resourceSubscriptions": [URI]}
            await upstream.set_price(120)
            updated = json.loads((await curl.line(r"^data: (.*resources/updated.*)$")).group(1))
            assert updated["params"]["uri"] == URI


async def test_the_readme_sdk_client_rereads_after_each_update(tmp_path: Path) -> None:
    async with _the_readme_sidecar(tmp_path) as (upstream, port):
        script = tmp_path / "watch.py"
        script.write_text(_ported(readme_block("quickstart-sdk"), {README_PORT: port}))
        async with _running([sys.executable, str(script)], "the README's SDK client", tmp_path) as client:
            await client.line(rf"^watching \['{re.escape(URI)}'\]$")
            for price in (130, 140):
                await upstream.set_price(price)
                await client.line(rf"^{re.escape(URI)} is now price={price}$")


async def test_the_readme_sdk_client_says_why_a_mistyped_uri_was_left_out(tmp_path: Path) -> None:
    # A newcomer's first mistake: the URI is not the server's. The script says why instead of waiting in silence.
    async with _the_readme_sidecar(tmp_path) as (_, port):
        script = tmp_path / "watch.py"
        mistyped = readme_block("quickstart-sdk").replace(f'["{URI}"]', '["catalog://prize"]')
        assert mistyped != readme_block("quickstart-sdk"), "the README's script lists its URIs as a list literal"
        script.write_text(_ported(mistyped, {README_PORT: port}))
        async with _running([sys.executable, str(script)], "the README's SDK client", tmp_path) as client:
            await client.line(r"^watching \[\]$")
            await client.line(r"^catalog://prize left out: Unknown resource: catalog://prize$")


def test_the_readme_sdk_client_is_the_one_the_demo_prints() -> None:
    assert readme_block("quickstart-sdk") == sdk_snippet(f"http://127.0.0.1:{README_PORT}/mcp", URI)
