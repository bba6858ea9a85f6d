"""The child as an operating-system process: a minimal environment, a session of its own, and its group's end.

`start_new_session` makes the child the leader of a new session and process group, so every process it
starts (npx's node, uvx's python, a `sh -c` wrapper's command) is in that group unless it leaves on
purpose. Ending the group, not the child, is what leaves no orphan: SIGTERM to the group, then SIGKILL
to it after the grace, whatever the wrappers in between do with signals.

The child's stdin is a pipe of our own making, with a second handle on its write end: through it the
kernel says how many bytes we wrote are still unread (FIONREAD), so a child that died can be told apart
as one that read its request first from one that never got that far (a failed download, a missing key).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import sys
import termios
from collections.abc import Mapping, Sequence

__all__ = [
    "INHERITED_ENVIRONMENT",
    "REACH_ENVIRONMENT",
    "ChildStdin",
    "StdioStartError",
    "child_environment",
    "end_process_group",
    "exit_reason",
    "start_in_own_session",
]

logger = logging.getLogger(__name__)

INHERITED_ENVIRONMENT = (
    *("PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM"),
    *("LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR"),
)
"""What a child inherits of the sidecar's environment (the SDK's default set, plus locale, time zone and temp
directory): enough for npx, uvx or python to find themselves, never the sidecar's own secrets."""

REACH_ENVIRONMENT = (
    *("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy"),
    *("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"),
    *("PIP_INDEX_URL", "UV_INDEX_URL", "NPM_CONFIG_REGISTRY"),
)
"""Inherited too: what a child needs to reach its package registry behind a proxy or a private CA (`uvx` and
`npx` download the server at its first start). Settings, not secrets; a proxy URL with a password in it is
the operator's own choice to pass."""

_GROUP_LOOK_S = 0.02


class StdioStartError(Exception):
    """The command could not be started at all (missing program, not executable, bad working directory)."""


def child_environment(
    extra: Mapping[str, str], names: Sequence[str] = (), inherited: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A minimal environment: `INHERITED_ENVIRONMENT`, `REACH_ENVIRONMENT` and `names` (upstream.inherit_env) from
    the sidecar's, then `extra` (upstream.env) over it."""
    source = os.environ if inherited is None else inherited
    wanted = (*INHERITED_ENVIRONMENT, *REACH_ENVIRONMENT, *names)
    return {**{name: source[name] for name in wanted if name in source}, **extra}


class ChildStdin:
    """The child's stdin: a stream writer on the pipe, and (on Linux) a second handle on the pipe's write end that
    outlives the writer's (which closes when the child's end does), to ask how much of what was written the child
    has not read."""

    def __init__(self, writer: asyncio.StreamWriter, watch_fd: int | None) -> None:
        self.writer = writer
        self._watch_fd = watch_fd
        self._written = 0
        self._unread_at_close: int | None = None

    async def write(self, data: bytes) -> None:
        """Write `data` and wait for the pipe to take it (BrokenPipeError, ConnectionResetError: the child's end is
        closed)."""
        self.writer.write(data)
        await self.writer.drain()
        self._written += len(data)

    def read_it_all(self) -> bool | None:
        """Once closed: True when every byte written had been read, False when some had not (or nothing was
        written), None when that cannot be told (not Linux)."""
        if self._written == 0:
            return False
        return None if self._unread_at_close is None else self._unread_at_close == 0

    def close(self) -> None:
        """Close our side (the child reads end of input), remembering how much written was still unread."""
        if self._watch_fd is not None:
            unread = array.array("i", [0])
            with contextlib.suppress(OSError):
                fcntl.ioctl(self._watch_fd, termios.FIONREAD, unread)
                self._unread_at_close = unread[0]
            os.close(self._watch_fd)
            self._watch_fd = None
        self.writer.close()


async def start_in_own_session(
    command: Sequence[str], env: Mapping[str, str], cwd: str | None
) -> tuple[asyncio.subprocess.Process, ChildStdin]:
    """Start `command` with pipes on stdin, stdout and stderr, leading a session (and process group) of its own."""
    read_end, write_end = os.pipe()  # both close on exec: the child gets read_end as its fd 0 only
    try:
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=read_end,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        os.close(write_end)
        raise StdioStartError(f"cannot start {command[0]!r}: {exc.strerror or exc}") from exc
    finally:
        os.close(read_end)
    # FIONREAD on a pipe's write end counts the unread bytes on Linux; elsewhere it may not, so it is not asked.
    watch_fd = os.dup(write_end) if sys.platform.startswith("linux") else None
    loop = asyncio.get_running_loop()
    protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader())  # its flow control gives the writer `drain`
    transport, _ = await loop.connect_write_pipe(lambda: protocol, os.fdopen(write_end, "wb", buffering=0))
    return proc, ChildStdin(asyncio.StreamWriter(transport, protocol, None, loop), watch_fd)


async def end_process_group(proc: asyncio.subprocess.Process, grace_s: float, label: str) -> None:
    """SIGTERM to the group `proc` leads, SIGKILL to it after `grace_s`; returns once no process of it lives (or
    another `grace_s` after the SIGKILL)."""
    group = proc.pid  # the session leader: its pid names the group
    _signal_group(group, signal.SIGTERM)
    try:
        await asyncio.wait_for(_group_gone(proc), grace_s)
    except TimeoutError:
        logger.warning(
            "stdio server still running after SIGTERM; sending SIGKILL to its process group",
            extra={"upstream": label, "pid": group, "grace_s": grace_s},
        )
        _signal_group(group, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_group_gone(proc), grace_s)


def exit_reason(code: int | None) -> str:
    """How the process ended, in words ("exited with code 1", "was killed by SIGKILL")."""
    if code is None:
        return "is gone"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


async def _group_gone(proc: asyncio.subprocess.Process) -> None:
    await proc.wait()
    while _group_alive(proc.pid):  # noqa: ASYNC110  no event tells when the last of a group is gone: look again
        await asyncio.sleep(_GROUP_LOOK_S)


def _signal_group(group: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)


def _group_alive(group: int) -> bool:
    """True while a process of the group still lives (zombies, dead but not yet reaped, do not count)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.isdir("/proc"):
        return True  # without /proc a zombie cannot be told apart: count it alive
    # killpg succeeds on zombies too (an orphan waits for init to reap it): look for a member that is not one.
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == group and fields[0] != b"Z":
                return True
    return False
