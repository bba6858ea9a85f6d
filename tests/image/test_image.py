"""The container image as a user runs it: built from the committed Dockerfile by `.ci/build-image` (buildah, no
daemon, no registry), run here by `buildah run --isolation chroot` on the host network.

Each test starts a working container of the image and runs its ENTRYPOINT and CMD with its shipped config, as the
image's own user; `MCP_SIDECAR__*` variables point it at a real upstream on 127.0.0.1 (and bind it there: the host
network is shared). Signals go to the sidecar's own process, as a runtime sends them to PID 1: `buildah run` keeps
`buildah-chroot-exec` between itself and the command, and a signal to buildah would tear that down first.

The stdio image is the recipe in the Dockerfile's comment, built FROM the first. The suite's own run leaves this
folder out (pyproject's norecursedirs); CI builds the images, then runs it by name: `bash .ci/build-image &&
python3 -m pytest -rs tests/image`. Without buildah or the images, each test skips as a missing peer (a failure
under CI).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.kit import SUB_ID_KEY, ListenStream, listening, rpc, scrape
from tests.peers import Upstream, start_upstream
from tests.peers.stdio_peers import live_processes, session_members
from tests.prereqs import require_binary, skip_missing
from tests.procs import ServerProcess, free_port, http_answers

IMAGE = "localhost/mcp-sidecar:test"
STDIO_IMAGE = "localhost/mcp-sidecar-stdio:test"
BUILD = "bash .ci/build-image"
START_S = 60.0
"""Bound on a container's start: buildah mounts the image first, then the sidecar starts."""
WAIT_S = 20.0
PRICE = "catalog://price"


async def _buildah(*args: str, within_s: float = START_S) -> tuple[int, str]:
    """`buildah ARGS` run to its end (bounded): its exit code and output."""
    proc = await asyncio.create_subprocess_exec(
        require_binary("buildah", needed_by="the image tests"),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(within_s):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


async def image_config(name: str) -> dict[str, Any]:
    """The image's Docker config (User, Env, Entrypoint, Cmd, Healthcheck); skips as a missing peer without it."""
    if os.geteuid() != 0:
        skip_missing("buildah runs chroot-isolated containers as root only; the image tests need it")
    code, out = await _buildah("inspect", "--type", "image", name)
    if code != 0:
        skip_missing(f"the image {name} is not built ({BUILD} builds it): {out.strip()}")
    config: dict[str, Any] = json.loads(out)["Docker"]["config"]
    return config


def _children(pid: int) -> list[int]:
    """The children of `pid`, whichever of its threads started them (buildah's are Go threads)."""
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            children.extend(int(child) for child in (task / "children").read_text().split())
    return children


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def _open_files(pid: int) -> int:
    """The soft open-files limit of `pid`."""
    line = next(line for line in Path(f"/proc/{pid}/limits").read_text().splitlines() if line.startswith("Max open"))
    return int(line.split()[3])


def _uids(pid: int) -> set[int]:
    line = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:"))
    return {int(uid) for uid in line.split()[1:]}


@dataclass
class Sidecar:
    """The image's command running in a container: its ports on 127.0.0.1 and the `buildah run` process."""

    service: ServerProcess
    port: int
    admin_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def pid(self) -> int:
        """The entrypoint's own process: the first below `buildah run` that is not buildah's."""
        level = [self.service.pid]
        while level:
            for pid in level:
                with contextlib.suppress(OSError, IndexError):
                    if not Path(_cmdline(pid)[0]).name.startswith("buildah"):
                        return pid
            level = [child for pid in level for child in _children(pid)]
        raise AssertionError(f"no entrypoint process under buildah\n{self.service.log_tail()}")

    def logged_config(self) -> dict[str, Any]:
        """The effective configuration, as the sidecar logged it at start."""
        config: dict[str, Any] = next(line for line in self.log_lines() if line.get("msg") == "configuration")["config"]
        return config

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.service.log_text().splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict):
                    lines.append(entry)
        return lines

    async def terminate(self, within_s: float) -> int:
        """SIGTERM to the sidecar's own process, as a runtime sends it; the exit code `buildah run` passes on."""
        os.kill(self.pid(), signal.SIGTERM)
        return await self.service.wait(within_s)


class Container:
    """A working container of an image (`buildah from`), removed when the block is left."""

    def __init__(self, image: str, workdir: Path) -> None:
        self.image = image
        self.workdir = workdir
        self.name = ""

    async def __aenter__(self) -> Container:
        code, out = await _buildah("from", "--pull=never", "--quiet", self.image)
        assert code == 0, out
        self.name = out.strip().splitlines()[-1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await _buildah("rm", self.name)

    def _run_argv(self, env: Mapping[str, str], argv: Sequence[str]) -> list[str]:
        flags = [f"--env={key}={value}" for key, value in env.items()]
        return ["buildah", "run", "--isolation", "chroot", *flags, self.name, "--", *argv]

    async def exec(self, env: Mapping[str, str], argv: Sequence[str]) -> int:
        """Run `argv` in the container to its end (bounded); its exit code."""
        code, out = await _buildah(*self._run_argv(env, argv)[1:])
        print(f"$ {' '.join(argv)} -> {code}\n{out}")
        return code

    @contextlib.asynccontextmanager
    async def serving(self, config: dict[str, Any], env: Mapping[str, str]) -> AsyncIterator[Sidecar]:
        """The image's ENTRYPOINT and CMD, run with `env` on free ports of 127.0.0.1 until ready (/readyz 200)."""
        port, admin_port = free_port(), free_port()
        env = {
            "MCP_SIDECAR__LISTEN__HOST": "127.0.0.1",
            "MCP_SIDECAR__LISTEN__PORT": str(port),
            "MCP_SIDECAR__ADMIN__HOST": "127.0.0.1",
            "MCP_SIDECAR__ADMIN__PORT": str(admin_port),
            **env,
        }
        argv = self._run_argv(env, [*config["Entrypoint"], *config["Cmd"]])
        service = ServerProcess(self.image, argv, self.workdir / "sidecar.log")
        async with service.serving(http_answers(f"http://127.0.0.1:{port}/readyz"), START_S):
            sidecar = Sidecar(service, port, admin_port)
            try:
                yield sidecar
            finally:
                if service.running:  # a test that failed half-way: stop it as a runtime would, then buildah
                    with contextlib.suppress(AssertionError, ProcessLookupError):
                        os.kill(sidecar.pid(), signal.SIGTERM)
        print(service.log_tail())


@pytest.fixture
async def up() -> AsyncIterator[Upstream]:
    async with await start_upstream("modern", read_ttl_ms=300) as upstream:
        yield upstream


async def test_it_runs_its_entrypoint_and_shipped_config_as_its_own_user_and_starts_cleanly(
    tmp_path: Path, up: Upstream
) -> None:
    config = await image_config(IMAGE)
    assert config["User"] not in ("", "0", "root", "root:root"), "the image runs as root"
    async with (
        Container(IMAGE, tmp_path) as container,
        container.serving(config, {"MCP_SIDECAR__UPSTREAM__URL": up.url}) as sidecar,
    ):
        pid = sidecar.pid()
        _python, script, *args = _cmdline(pid)
        assert Path(script).name == config["Entrypoint"][0] and args == config["Cmd"]
        user = config["User"].split(":")[0]
        assert 0 not in _uids(pid) and (not user.isdigit() or _uids(pid) == {int(user)}), _uids(pid)
        logged = sidecar.logged_config()
        assert logged["upstream"]["url"] == up.url
        # The client cap in force fits the open-files limit the runtime gave (1,024 under buildah).
        assert logged["listen"]["max_connections"] < _open_files(pid)
    # Nothing to warn about under the runtime's defaults, the open-files limit (1,024 under buildah) included.
    assert [line for line in sidecar.log_lines() if line["level"] in ("warning", "error")] == []


async def test_a_listen_is_acked_and_notified_of_a_change_and_metrics_are_on_the_admin_port(
    tmp_path: Path, up: Upstream, http: aiohttp.ClientSession
) -> None:
    config = await image_config(IMAGE)
    async with (
        Container(IMAGE, tmp_path) as container,
        container.serving(config, {"MCP_SIDECAR__UPSTREAM__URL": up.url}) as sidecar,
    ):
        stream = await ListenStream.connect(http, sidecar.url, "image-1", [PRICE])
        try:
            since = stream.mark()
            await up.set_price(321)
            update = await stream.wait_update(PRICE, WAIT_S, since)
            assert update["params"]["_meta"][SUB_ID_KEY] == "image-1"
            status, reply = await rpc(http, sidecar.url, "resources/read", {"uri": PRICE})
            assert status == 200 and reply["result"]["contents"][0]["text"] == "price=321", reply
            metrics = await scrape(http, sidecar.admin_url)
            assert metrics.total("mcp_sidecar_listen_streams") == 1
            assert metrics.total("mcp_sidecar_notifications_total", method="notifications/resources/updated") >= 1
            assert metrics.total("mcp_sidecar_upstream_up") == 1
            async with http.get(f"http://127.0.0.1:{sidecar.port}/metrics") as resp:
                assert resp.status == 404  # the client port does not serve them
        finally:
            await stream.aclose()


async def test_the_healthcheck_command_passes_inside_the_container_and_fails_without_a_sidecar(
    tmp_path: Path, up: Upstream
) -> None:
    config = await image_config(IMAGE)
    check = config.get("Healthcheck", {}).get("Test") or []
    assert check[:1] == ["CMD"], f"the image has no exec-form HEALTHCHECK: {config.get('Healthcheck')}"
    async with Container(IMAGE, tmp_path) as container:
        env = {"MCP_SIDECAR__UPSTREAM__URL": up.url}
        async with container.serving(config, env) as sidecar:
            port = {"MCP_SIDECAR__LISTEN__PORT": str(sidecar.port)}
            assert await container.exec(port, check[1:]) == 0
        assert await container.exec(port, check[1:]) != 0  # the same check, with the sidecar gone


async def test_sigterm_ends_streams_with_their_result_frame_and_exits_0_within_the_grace(
    tmp_path: Path, up: Upstream, http: aiohttp.ClientSession
) -> None:
    config = await image_config(IMAGE)
    async with (
        Container(IMAGE, tmp_path) as container,
        container.serving(config, {"MCP_SIDECAR__UPSTREAM__URL": up.url}) as sidecar,
    ):
        streams = {
            request_id: await ListenStream.connect(http, sidecar.url, request_id, [PRICE]) for request_id in (7, "l-2")
        }
        grace_s = sidecar.logged_config()["listen"]["shutdown_grace_s"]  # the shipped config's
        try:
            assert await sidecar.terminate(within_s=grace_s + 5) == 0, sidecar.service.log_tail()
            for request_id, stream in streams.items():
                final = await stream.wait_for(lambda frame: "result" in frame, WAIT_S)
                assert final == {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "result": {"resultType": "complete", "_meta": {SUB_ID_KEY: request_id}},
                }
                assert final is stream.frames[-1]
        finally:
            for stream in streams.values():
                await stream.aclose()


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(None, id="the recipe's command"),
        # A shell that leaves a second process in the child's group: signalling only the child would orphan it.
        pytest.param("sh -c 'sleep 600 >/dev/null & exec python -m mcp_server_time'", id="behind a shell"),
    ],
)
async def test_the_stdio_recipe_serves_a_read_and_a_listen_through_its_child_and_leaves_no_orphan(
    tmp_path: Path, http: aiohttp.ClientSession, command: str | None
) -> None:
    config = await image_config(STDIO_IMAGE)
    assert any(entry.startswith("MCP_SIDECAR__UPSTREAM__COMMAND=") for entry in config["Env"]), config["Env"]
    env = {} if command is None else {"MCP_SIDECAR__UPSTREAM__COMMAND": command}
    async with Container(STDIO_IMAGE, tmp_path) as container, container.serving(config, env) as sidecar:
        status, reply = await rpc(
            http, sidecar.url, "tools/call", {"name": "get_current_time", "arguments": {"timezone": "Etc/UTC"}}
        )
        assert status == 200 and "Etc/UTC" in reply["result"]["content"][0]["text"], reply
        async with listening(ListenStream(http, sidecar.url, "time-1", toolsListChanged=True)) as [ack]:
            assert ack["params"]["notifications"] == {"toolsListChanged": True}
            pid = sidecar.pid()
            [child] = _children(pid)
            assert _cmdline(child)[-2:] == ["-m", "mcp_server_time"]
            group = session_members(child)  # the child leads a session (and group) of its own
            assert len(group) == (1 if command is None else 2), group
            assert await sidecar.terminate(within_s=WAIT_S) == 0, sidecar.service.log_tail()
        assert live_processes([pid, *group]) == []
