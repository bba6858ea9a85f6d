"""The container image as a user runs it: built from the committed Dockerfile by `.ci/build-image` (buildah, no
daemon, no registry), run here by `buildah run --isolation chroot` on the host network.

Each test starts a working container of the image and runs its ENTRYPOINT and CMD as the image's own user, with its
shipped config (`MCP_SIDECAR__*` variables pointing it at a real upstream on 127.0.0.1, and binding it there: the
host network is shared) or with a config file of the test's mounted over it. Signals go to the entrypoint's process
(tini), as a runtime sends them to PID 1: `buildah run` keeps `buildah-chroot-exec` between itself and the command,
and a signal to buildah would tear that down first. A chroot-isolated container has no PID namespace of its own, so
the entrypoint is not PID 1 here: its tini runs as a subreaper (`-s`), which the kernel hands orphans to as it
would to PID 1.

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
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
import yaml

from tests.kit import SUB_ID_KEY, ListenStream, eventually, listening, rpc, scrape
from tests.peers import Upstream, start_upstream
from tests.peers.stdio_peers import live_processes, session_members
from tests.prereqs import require_binary, skip_missing
from tests.procs import ServerProcess, free_port, http_answers

IMAGE = "localhost/mcp-sidecar:test"
STDIO_IMAGE = "localhost/mcp-sidecar-stdio:test"
BUILD = "bash .ci/build-image"
START_S = 60.0
"""Bound on a container's start: buildah mounts the image first, then the sidecar starts."""
CONTAINER_WAIT_S = 20.0
"""Above the kit's WAIT_S: what the sidecar in a started container does (an update, a final frame, an exit)."""
PRICE = "catalog://price"
CONFIG_FILE = "/etc/mcp-sidecar/config.yaml"
"""Where the image's own configuration lies, and where an operator mounts theirs."""


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


def _state(pid: int) -> tuple[str, int] | None:
    """A process's state letter (Z: a zombie, dead and not reaped) and its parent, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, parent = text[text.rindex(")") + 2 :].split()[:2]
    return state, int(parent)


def _listening_addresses(pid: int) -> set[tuple[str, int]]:
    """The (address, port) of each TCP socket `pid` listens on, from its open sockets and its /proc/net tables."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    found = set()
    for table, width in (("tcp", 4), ("tcp6", 16)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                address, port = local.split(":")
                raw = bytes.fromhex(address)
                # /proc writes each 32-bit word of the address in host (little-endian) order.
                ordered = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))
                host = ".".join(str(b) for b in ordered) if width == 4 else ordered.hex(":", 2)
                found.add((host, int(port, 16)))
    return found


@dataclass
class Sidecar:
    """The image's command running in a container: its ports on 127.0.0.1 and the `buildah run` process."""

    service: ServerProcess
    port: int
    admin_port: int
    env: dict[str, str] = field(default_factory=dict)
    """The variables the container was given (a HEALTHCHECK run beside it sees the same)."""
    mounts: dict[Path, str] = field(default_factory=dict)
    """Host paths mounted into the container, and where."""
    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/mcp"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def entrypoint_pid(self) -> int:
        """The entrypoint's own process (the image's init): the first below `buildah run` that is not buildah's."""
        level = [self.service.pid]
        while level:
            for pid in level:
                with contextlib.suppress(OSError, IndexError):
                    if not Path(_cmdline(pid)[0]).name.startswith("buildah"):
                        return pid
            level = [child for pid in level for child in _children(pid)]
        raise AssertionError(f"no entrypoint process under buildah\n{self.service.log_tail()}")

    def pid(self) -> int:
        """The sidecar's own process: the first at or below the entrypoint that runs the `mcp-sidecar` script."""
        level = [self.entrypoint_pid()]
        while level:
            for pid in level:
                with contextlib.suppress(OSError, IndexError):
                    if Path(_cmdline(pid)[1]).name == "mcp-sidecar":
                        return pid
            level = [child for pid in level for child in _children(pid)]
        raise AssertionError(f"no mcp-sidecar process in the container\n{self.service.log_tail()}")

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
        """SIGTERM to the entrypoint, as a runtime sends it to PID 1; the exit code `buildah run` passes on."""
        os.kill(self.entrypoint_pid(), signal.SIGTERM)
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

    def _run_argv(self, env: Mapping[str, str], argv: Sequence[str], mounts: Mapping[Path, str]) -> list[str]:
        flags = [f"--env={key}={value}" for key, value in env.items()]
        flags += [f"--volume={source}:{target}:ro" for source, target in mounts.items()]
        return ["buildah", "run", "--isolation", "chroot", *flags, self.name, "--", *argv]

    async def exec(
        self, env: Mapping[str, str], argv: Sequence[str], mounts: Mapping[Path, str] | None = None
    ) -> tuple[int, str]:
        """Run `argv` in the container to its end (bounded); its exit code and output."""
        code, out = await _buildah(*self._run_argv(env, argv, mounts or {})[1:])
        print(f"$ {' '.join(argv)} -> {code}\n{out}")
        return code, out

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
        async with self._serving(config, env, {}, port, admin_port, "http") as sidecar:
            yield sidecar

    @contextlib.asynccontextmanager
    async def serving_mounted(
        self, config: dict[str, Any], file: dict[str, Any], mounts: Mapping[Path, str]
    ) -> AsyncIterator[Sidecar]:
        """The image's ENTRYPOINT and CMD with `file` mounted over its configuration (and `mounts` beside it), and
        no variable of the test's: `file` says on which ports of 127.0.0.1 it listens."""
        path = self.workdir / "mounted" / "config.yaml"
        path.parent.mkdir(mode=0o755)
        path.write_text(yaml.safe_dump(file), encoding="utf-8")
        path.chmod(0o644)  # the image's user reads it
        port, admin_port = file["listen"]["port"], file["admin"]["port"]
        scheme = "https" if file["listen"].get("tls") else "http"
        async with self._serving(config, {}, {path: CONFIG_FILE, **mounts}, port, admin_port, scheme) as sidecar:
            yield sidecar

    @contextlib.asynccontextmanager
    async def _serving(
        self,
        config: dict[str, Any],
        env: dict[str, str],
        mounts: dict[Path, str],
        port: int,
        admin_port: int,
        scheme: str,
    ) -> AsyncIterator[Sidecar]:
        argv = self._run_argv(env, [*config["Entrypoint"], *config["Cmd"]], mounts)
        service = ServerProcess(self.image, argv, self.workdir / "sidecar.log")
        # Ready once /readyz answers 200 on the admin listener (plain HTTP, whatever the MCP listener speaks).
        async with service.serving(http_answers(f"http://127.0.0.1:{admin_port}/readyz"), START_S):
            sidecar = Sidecar(service, port, admin_port, env, mounts, scheme)
            try:
                yield sidecar
            finally:
                if service.running:  # a test that failed half-way: stop it as a runtime would, then buildah
                    with contextlib.suppress(AssertionError, ProcessLookupError):
                        os.kill(sidecar.entrypoint_pid(), signal.SIGTERM)
        print(service.log_tail())


def _healthcheck(config: dict[str, Any]) -> list[str]:
    """The image's HEALTHCHECK command (exec form)."""
    check: list[str] = config.get("Healthcheck", {}).get("Test") or []
    assert check[:1] == ["CMD"], f"the image has no exec-form HEALTHCHECK: {config.get('Healthcheck')}"
    return check[1:]


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
        init, pid = sidecar.entrypoint_pid(), sidecar.pid()
        program, *arguments = _cmdline(init)  # the runtime runs the entrypoint by its path
        assert Path(program).name == "tini", "the image's entrypoint is its init"
        assert [Path(program).name, *arguments] == [*config["Entrypoint"], *config["Cmd"]]
        _python, script, *args = _cmdline(pid)
        assert _children(init) == [pid] and Path(script).name == "mcp-sidecar" and args == config["Cmd"]
        user = config["User"].split(":")[0]
        for each in (init, pid):
            assert 0 not in _uids(each) and (not user.isdigit() or _uids(each) == {int(user)}), _uids(each)
        logged = sidecar.logged_config()
        assert logged["upstream"]["url"] == up.url
        # The client cap in force fits the open-files limit the runtime gave (1,024 under buildah).
        assert logged["listen"]["max_connections"] < _open_files(pid)
    # Nothing to warn about under the runtime's defaults, the open-files limit (1,024 under buildah) included.
    assert [line for line in sidecar.log_lines() if line["level"] in ("warning", "error")] == []


async def test_every_interface_is_the_shipped_files_word_not_the_environments(tmp_path: Path) -> None:
    # Were it the environment's, it would win over a mounted file that says otherwise (the next test's).
    config = await image_config(IMAGE)
    env = dict(entry.split("=", 1) for entry in config["Env"])
    assert [name for name in env if name.startswith("MCP_SIDECAR__")] == [], config["Env"]
    assert env["MCP_SIDECAR_CONFIG"] == CONFIG_FILE
    async with Container(IMAGE, tmp_path) as container:
        upstream = {"MCP_SIDECAR__UPSTREAM__URL": "http://legacy:9000/mcp"}  # the one key the file leaves to you
        code, out = await container.exec(upstream, ["mcp-sidecar", "check-config", CONFIG_FILE])
    assert code == 0, out
    shown = json.loads(out[out.index("{") :])
    assert (shown["listen"]["host"], shown["listen"]["port"]) == ("0.0.0.0", 8080)
    assert (shown["admin"]["host"], shown["admin"]["port"]) == ("0.0.0.0", 9464)


async def test_a_mounted_file_replaces_the_shipped_one_whole_and_the_healthcheck_follows_it_over_tls(
    tmp_path: Path, up: Upstream
) -> None:
    config = await image_config(IMAGE)
    check = _healthcheck(config)
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    certificates = tmp_path / "tls"
    certificates.mkdir(mode=0o755)
    for name, pem in (("tls.crt", leaf.cert_chain_pems[0]), ("tls.key", leaf.private_key_pem)):
        pem.write_to_path(str(certificates / name))
        (certificates / name).chmod(0o644)  # the image's user reads them
    port, admin_port = free_port(), free_port()
    file = {
        "upstream": {"url": up.url},
        # No listen.host: the shipped file's 0.0.0.0 must not be left underneath (the default, loopback, applies).
        "listen": {
            "port": port,
            "tls": {"cert_file": "/etc/mcp-sidecar-tls/tls.crt", "key_file": "/etc/mcp-sidecar-tls/tls.key"},
        },
        "admin": {"host": "127.0.0.1", "port": admin_port},
    }
    async with (
        Container(IMAGE, tmp_path) as container,
        container.serving_mounted(config, file, {certificates: "/etc/mcp-sidecar-tls"}) as sidecar,
    ):
        assert _listening_addresses(sidecar.pid()) == {("127.0.0.1", port), ("127.0.0.1", admin_port)}
        trusted = ssl.create_default_context()
        ca.configure_trust(trusted)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trusted)) as https:
            status, reply = await rpc(https, sidecar.url, "resources/read", {"uri": PRICE})
        assert status == 200 and reply["result"]["contents"][0]["text"] == "price=100", reply
        code, out = await container.exec(sidecar.env, check, sidecar.mounts)
        assert code == 0 and f"healthy: https://127.0.0.1:{port}/healthz answered 200" in out, out


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
            update = await stream.wait_update(PRICE, CONTAINER_WAIT_S, since)
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
    check = _healthcheck(config)
    async with Container(IMAGE, tmp_path) as container:
        async with container.serving(config, {"MCP_SIDECAR__UPSTREAM__URL": up.url}) as sidecar:
            code, out = await container.exec(sidecar.env, check)
            assert code == 0 and f"healthy: http://127.0.0.1:{sidecar.port}/healthz answered 200" in out, out
        code, out = await container.exec(sidecar.env, check)  # the same check, with the sidecar gone
        assert code == 1 and "connection refused" in out, out


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
                final = await stream.wait_for(lambda frame: "result" in frame, CONTAINER_WAIT_S)
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
            init, pid = sidecar.entrypoint_pid(), sidecar.pid()
            [child] = _children(pid)
            assert _cmdline(child)[-2:] == ["-m", "mcp_server_time"]
            group = session_members(child)  # the child leads a session (and group) of its own
            assert len(group) == (1 if command is None else 2), group
            assert await sidecar.terminate(within_s=CONTAINER_WAIT_S) == 0, sidecar.service.log_tail()
        assert live_processes([init, pid, *group]) == []


async def test_an_orphan_the_stdio_childs_own_children_leave_is_reaped_by_the_images_init(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    # The child's shell starts a subshell that starts `sleep` and exits at once: the sleep's parent is gone, and
    # the kernel hands it to the nearest subreaper (PID 1 in a pod). When it dies, that process must wait() on it,
    # or it stays a zombie: the sidecar's stop ends the child's group, but this one dies before any stop.
    config = await image_config(STDIO_IMAGE)
    command = "sh -c '(sleep 600 >/dev/null &); exec python -m mcp_server_time'"
    env = {"MCP_SIDECAR__UPSTREAM__COMMAND": command}
    async with Container(STDIO_IMAGE, tmp_path) as container, container.serving(config, env) as sidecar:
        init, pid = sidecar.entrypoint_pid(), sidecar.pid()
        [child] = _children(pid)

        def orphans() -> list[int]:
            return [p for p in session_members(child) if _cmdline(p) == ["sleep", "600"]]

        def handed_to_init() -> bool:
            found = orphans()
            return len(found) == 1 and (_state(found[0]) or ("", 0))[1] == init

        await eventually(
            handed_to_init, CONTAINER_WAIT_S, what=f"the orphaned sleep handed to the image's init ({init})"
        )
        [orphan] = orphans()
        os.kill(orphan, signal.SIGKILL)
        await eventually(
            lambda: _state(orphan) is None, CONTAINER_WAIT_S, what="the killed orphan reaped, not left a zombie"
        )
        status, reply = await rpc(
            http, sidecar.url, "tools/call", {"name": "get_current_time", "arguments": {"timezone": "Etc/UTC"}}
        )
        assert status == 200 and "Etc/UTC" in reply["result"]["content"][0]["text"], reply
        assert await sidecar.terminate(within_s=CONTAINER_WAIT_S) == 0, sidecar.service.log_tail()
    assert live_processes([init, pid, child]) == []
