"""A throwaway PostgreSQL cluster on 127.0.0.1 for the tests: Debian's server, a data folder of its own, a
password-protected owner, and `psql` to change it behind an MCP server's back.

    async with start_postgres() as pg:
        pg.url                                   # postgresql://owner:PASSWORD@127.0.0.1:PORT/postgres
        await pg.sql("ALTER TABLE notes ADD COLUMN tag text")

PostgreSQL refuses to run as root: as root, `initdb` and the server run as the `postgres` user the Debian
package creates (`setpriv`, so the server process is the child the tests stop, with no wrapper between), in a
folder under the system temp directory that user can reach (pytest's own is private to root). The server
listens on TCP 127.0.0.1 only (no Unix socket), without fsync (nothing outlives the test), and is stopped
with a fast shutdown, then removed, when the block is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import secrets
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.prereqs import skip_missing
from tests.procs import Probe, ServerProcess, free_port

__all__ = ["OWNER", "Postgres", "postgres_bin", "start_postgres"]

OWNER = "owner"
"""The cluster's superuser, who owns the tables the tests make."""
START_TIMEOUT_S = 60.0
"""initdb and a first start on a loaded 2-core machine take several seconds."""
STOP_TIMEOUT_S = 10.0
PSQL_TIMEOUT_S = 30.0
_RUN_AS = "postgres"
"""The user the Debian package creates, for a run as root."""


def postgres_bin() -> Path:
    """The folder of Debian's PostgreSQL server binaries (the newest installed major), or a skip naming the package."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda path: int(path.parent.parent.name))
    if not found:
        skip_missing("the PostgreSQL server is not installed (Debian package `postgresql`); server-postgres needs one")
    return found[-1].parent


@dataclass
class Postgres:
    """A running cluster: where it listens, who owns it, and how to run SQL on it as that owner."""

    bin: Path
    port: int
    password: str
    process: ServerProcess
    home: Path
    """Its data folder and log; removed when it stops."""

    @property
    def url(self) -> str:
        """The connection URL, password included, as server-postgres's README passes it on the command line."""
        return f"postgresql://{OWNER}:{self.password}@127.0.0.1:{self.port}/postgres"

    async def sql(self, statements: str, *, password: str | None = None) -> str:
        """Run `statements` with psql as the owner (stopping at the first error); its unaligned output.
        `password`: another one than the owner's, to see it refused."""
        argv = [str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", OWNER, "-d", "postgres",
                "-v", "ON_ERROR_STOP=1", "-qAtX", "-c", statements]  # fmt: skip
        return await _run(argv, {"PGPASSWORD": password or self.password, "PGCONNECT_TIMEOUT": "5"})


async def _run(argv: Sequence[str], env: dict[str, str] | None = None) -> str:
    """Run a command to its end (bounded); its stdout, or an AssertionError with its output."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env={**os.environ, **(env or {})}
    )
    try:
        async with asyncio.timeout(PSQL_TIMEOUT_S):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"{argv[0]} did not finish within {PSQL_TIMEOUT_S} s") from None
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv[:1])} exited {proc.returncode}: {text}")
    return text


def _as_server_user(argv: list[str], home: Path) -> list[str]:
    """`argv` as the user PostgreSQL will run as: unchanged for a user who is not root; as root, the Debian
    package's user (owning `home`), the program exec'd in place so its pid is the child's."""
    if os.geteuid() != 0:
        return argv
    try:
        user = pwd.getpwnam(_RUN_AS)
    except KeyError:
        skip_missing(f"no `{_RUN_AS}` user to run PostgreSQL as (Debian package `postgresql` creates it)")
    os.chown(home, user.pw_uid, user.pw_gid)
    for path in home.rglob("*"):
        os.chown(path, user.pw_uid, user.pw_gid)
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups", "--", *argv]


def _answers(bin_dir: Path, port: int) -> Probe:
    """A probe: `pg_isready` says the server accepts connections (not merely that its port is open)."""

    async def probe() -> bool:
        proc = await asyncio.create_subprocess_exec(
            str(bin_dir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port), "-t", "2",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        return await proc.wait() == 0

    return probe


@contextlib.asynccontextmanager
async def start_postgres() -> AsyncIterator[Postgres]:
    """A fresh cluster on a free loopback port, ready inside the block; stopped and removed when it is left."""
    bin_dir = postgres_bin()
    home = Path(tempfile.mkdtemp(prefix="sidecar-pg-"))
    try:
        password = secrets.token_urlsafe(18)
        (home / "pwfile").write_text(password + "\n", encoding="utf-8")
        data = home / "data"
        initdb = [str(bin_dir / "initdb"), "-D", str(data), "-U", OWNER, f"--pwfile={home / 'pwfile'}",
                  "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-sync"]  # fmt: skip
        await _run(_as_server_user(initdb, home))
        (home / "pwfile").unlink()
        port = free_port()
        server = [str(bin_dir / "postgres"), "-D", str(data), "-p", str(port), "-c", "listen_addresses=127.0.0.1",
                  "-c", "unix_socket_directories=", "-c", "fsync=off", "-c", "max_connections=20",
                  "-c", "shared_buffers=16MB"]  # fmt: skip
        process = ServerProcess(f"postgres:{port}", _as_server_user(server, home), home / "postgres.log", cwd=home)
        await process.start(_answers(bin_dir, port), START_TIMEOUT_S)
        try:
            yield Postgres(bin_dir, port, password, process, home)
        finally:
            # SIGTERM would wait for every client to leave; SIGINT is the fast shutdown (clients disconnected).
            await process.signal(signal.SIGINT)
            await process.stop(STOP_TIMEOUT_S)
    finally:
        shutil.rmtree(home, ignore_errors=True)
