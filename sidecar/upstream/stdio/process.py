"""The child as an operating-system process: a minimal environment, a session of its own, and its group's end.

`start_new_session` makes the child the leader of a new session and process group, so every process it
starts (npx's node, uvx's python, a `sh -c` wrapper's command) is in that group unless it leaves on
purpose. Ending the group, not the child, is what leaves no orphan: SIGTERM to the group, then SIGKILL
to it after the grace, whatever the wrappers in between do with signals.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Mapping, Sequence

__all__ = [
    "INHERITED_ENVIRONMENT",
    "REACH_ENVIRONMENT",
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


async def start_in_own_session(
    command: Sequence[str], env: Mapping[str, str], cwd: str | None
) -> asyncio.subprocess.Process:
    """Start `command` with pipes on stdin, stdout and stderr, leading a session (and process group) of its own."""
    try:
        return await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        raise StdioStartError(f"cannot start {command[0]!r}: {exc.strerror or exc}") from exc


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
