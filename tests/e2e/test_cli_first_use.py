"""The `mcp-sidecar` command as a newcomer first meets it, each as a real process: the bare command, the help
texts, two sidecars on one host, and the demo's admin listener."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.kit import rpc
from tests.kit.cli import REPO_ROOT, START_TIMEOUT_S, cli, cli_env
from tests.peers import Upstream
from tests.procs import free_port

LISTENING = r'"msg": ?"mcp-sidecar listening"'
DEFAULT_ADMIN_PORT = 9464


def _command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", *args],
        cwd=REPO_ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )


# -- the bare command and the help texts -------------------------------------------------------------------


def test_the_bare_command_prints_usage_and_an_example_and_exits_2() -> None:
    done = _command()
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith("usage: mcp-sidecar"), done.stderr
    assert "neither url nor command" not in done.stderr  # not the configuration error of a bare `run`
    assert "\n  mcp-sidecar run --upstream http://" in done.stderr, "an example to copy"
    assert "\n  mcp-sidecar demo" in done.stderr


def test_the_config_shorthand_without_a_command_still_runs() -> None:
    # `mcp-sidecar --config FILE` means `run --config FILE`: it reads the file instead of printing the usage.
    done = _command("--config", "no-such-sidecar.yaml")
    assert done.returncode == 1
    assert "no-such-sidecar.yaml: cannot read" in done.stderr, done.stderr


_ENTRY = re.compile(r"^( {2,4})(\S.*?)(?: {2,}(\S.*))?$")
_LISTED = ("positional arguments:", "options:", "commands:")


def _entries(text: str) -> dict[str, str]:
    """Each option, argument and command argparse's help lists, and its help (empty when it has none)."""
    found = {}
    for section in text.split("\n\n"):
        heading, *lines = section.splitlines()
        if heading not in _LISTED:
            continue
        for number, line in enumerate(lines):
            entry = _ENTRY.match(line)
            if entry is None or entry.group(2) == "COMMAND":
                continue  # a help's continuation line (indented deeper), or the commands' placeholder
            following = lines[number + 1] if number + 1 < len(lines) else ""
            on_next = re.match(r"^ {10,}(\S.*)$", following)
            found[entry.group(2)] = entry.group(3) or (on_next.group(1) if on_next else "")
    return found


@pytest.mark.parametrize("command", [[], ["run"], ["check-config"], ["demo"]], ids=["top", "run", "check", "demo"])
def test_every_option_has_help_text(command: list[str]) -> None:
    done = _command(*command, "--help")
    assert done.returncode == 0, done.stderr
    entries = _entries(done.stdout)
    assert len(entries) >= 2, done.stdout
    assert [name for name, help_text in entries.items() if not help_text] == [], done.stdout


def test_the_top_level_help_says_what_it_is_in_one_line_and_shows_an_example() -> None:
    text = _command("--help").stdout
    description = text.split("\n\n")[1]
    assert "\n" not in description and description.startswith("mcp-sidecar: a reverse proxy"), description
    assert "examples:\n  mcp-sidecar run --upstream http://127.0.0.1:9000/mcp" in text


@pytest.mark.parametrize("command", [["run"], ["demo"]])
def test_run_and_demo_offer_the_admin_and_log_format_flags(command: list[str]) -> None:
    text = _command(*command, "--help").stdout
    for flag in ("--admin-host", "--admin-port", "--log-format {auto,json,text}", "--port", "--log-level"):
        assert f"\n  {flag}" in text, f"{flag} missing:\n{text}"


@pytest.mark.parametrize(
    "args", [["demo", "--upstream", "http://127.0.0.1:9/mcp"], ["--upstream", "uvx mcp-server-time", "demo"]]
)
def test_demo_does_not_take_an_upstream_and_says_where_to_put_one(args: list[str]) -> None:
    assert "--upstream" not in _command("demo", "--help").stdout
    done = _command(*args)
    assert done.returncode == 2
    assert done.stdout == "", "the demo must not start"
    assert "the demo runs its own upstream" in done.stderr and "mcp-sidecar run --upstream" in done.stderr


# -- two sidecars on one host ------------------------------------------------------------------------------


async def _admin_status(http: aiohttp.ClientSession, admin: str) -> dict[str, object]:
    async with http.get(f"{admin}/status") as response:
        assert response.status == 200
        status: dict[str, object] = await response.json()
    async with http.get(f"{admin}/metrics") as response:
        assert response.status == 200 and "mcp_sidecar_requests_total" in await response.text()
    return status


async def test_two_sidecars_on_one_host_each_with_its_admin_port_both_serve(
    modern_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    first_port, second_port = free_port(), free_port()
    common = ("run", "--upstream", modern_upstream.url, "--port", "0")
    async with (
        cli(*common, "--admin-port", str(first_port)) as first,
        cli(*common, "--admin-host", "127.0.0.2", "--admin-port", str(second_port)) as second,
    ):
        instances = set()
        for sidecar, admin in ((first, f"http://127.0.0.1:{first_port}"), (second, f"http://127.0.0.2:{second_port}")):
            listening = json.loads((await sidecar.wait_for_line("stderr", LISTENING)).string)
            assert listening["admin"] == f"{admin}/metrics", sidecar.output()
            status, reply = await rpc(http, listening["url"], "resources/read", {"uri": "catalog://price"})
            assert status == 200 and reply["result"]["contents"][0]["text"] == "price=100", sidecar.output()
            instances.add((await _admin_status(http, admin))["instance"])
        assert len(instances) == 2, "each admin port answers for its own sidecar"

        # The same admin port twice: the second start says which listener and port, and exits.
        async with cli(*common, "--admin-port", str(first_port)) as third:
            await third.wait_for_line("stderr", rf"admin: cannot listen on 127\.0\.0\.1:{first_port}")
            assert await third.exit_code() == 1
        for sidecar in (first, second):
            assert await sidecar.stop(signal.SIGTERM) == 0, sidecar.output()


# -- the demo's admin listener -----------------------------------------------------------------------------


@contextlib.contextmanager
def _default_admin_port_taken() -> Iterator[None]:
    """Port 9464 busy while the demo starts, as when a sidecar runs beside it (it may be busy already)."""
    with socket.socket() as holder:
        with contextlib.suppress(OSError):
            holder.bind(("127.0.0.1", DEFAULT_ADMIN_PORT))
            holder.listen()
        yield


@pytest.mark.parametrize("asked", [False, True], ids=["free-port", "admin-port-flag"])
async def test_demo_prints_status_and_metrics_urls_that_answer(asked: bool, http: aiohttp.ClientSession) -> None:
    admin_port = free_port()
    flags = ["--admin-port", str(admin_port)] if asked else []
    with _default_admin_port_taken():
        async with cli("demo", "--port", "0", *flags, env=cli_env()) as demo:
            upstream = (await demo.wait_for_line("stdout", r"^demo upstream .*?(http://\S+/mcp)$")).group(1)
            status_url = (await demo.wait_for_line("stdout", r"(http://\S+)/status$")).group(0)
            metrics_url = (await demo.wait_for_line("stdout", r"(http://\S+)/metrics$")).group(0)
            admin = status_url.removesuffix("/status")
            assert metrics_url == f"{admin}/metrics"
            if asked:
                assert admin == f"http://127.0.0.1:{admin_port}"
            status = await _admin_status(http, admin)
            assert status["upstream"]["url"] == upstream  # type: ignore[index]
            assert await demo.stop(signal.SIGINT) == 0, demo.output()
    assert "Traceback" not in demo.output()


# -- a supervisor that stops it at once --------------------------------------------------------------------


async def test_sigterm_sent_the_moment_it_says_it_listens_is_a_clean_shutdown(modern_upstream: Upstream) -> None:
    # A supervisor (or a test) that stops the sidecar as soon as it reads the listening line must get the graceful
    # path, exit 0 and "shutting down", not the default action of SIGTERM (exit -15) because the handlers came later.
    async with cli("run", "--upstream", modern_upstream.url, "--port", "0", "--admin-port", "0") as sidecar:
        await sidecar.wait_for_line("stderr", LISTENING)
        assert await sidecar.stop(signal.SIGTERM) == 0, sidecar.output()
        assert any("shutting down" in line for line in sidecar.lines["stderr"]), sidecar.output()


# -- the demo's own first client ---------------------------------------------------------------------------


async def test_the_demo_prints_an_sdk_client_that_watches_its_resource_and_logs_its_stop(tmp_path: Path) -> None:
    async with cli("demo", "--port", "0", "--admin-port", "0", env=cli_env()) as demo:
        await demo.wait_for_line("stdout", r"^Ctrl-C to stop\.$")
        printed = demo.lines["stdout"]
        start = next(n for n, line in enumerate(printed) if line.startswith("Or with the official Python SDK"))
        script = tmp_path / "watch.py"
        script.write_text("\n".join(printed[start + 1 : printed.index("Ctrl-C to stop.")]).strip() + "\n")
        client = await asyncio.create_subprocess_exec(
            sys.executable, str(script), cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            assert client.stdout is not None
            async with asyncio.timeout(START_TIMEOUT_S):
                # As printed, it watches the demo's changing resource and re-reads it after a change.
                assert await client.stdout.readline() == b"watching ['catalog://plans/basic']\n"
                line = (await client.stdout.readline()).decode()
            assert re.fullmatch(r"catalog://plans/basic is now price=\d+\n", line), line
        finally:
            client.kill()
            await client.wait()
        assert await demo.stop(signal.SIGINT) == 0, demo.output()
    stopped = [line for line in demo.lines["stderr"] if "mcp-sidecar demo stopped" in line]
    assert stopped, demo.output()
