"""The throwaway PostgreSQL cluster (`tests/peers/postgres.py`) is what the server-postgres tests assume: it
takes its owner's password and no other, on 127.0.0.1, and leaves no process or folder behind."""

from __future__ import annotations

import pytest

from tests.peers.postgres import OWNER, start_postgres


async def test_the_cluster_takes_only_its_owners_password_and_leaves_nothing_behind() -> None:
    async with start_postgres() as pg:
        assert await pg.sql("SELECT current_user, inet_server_addr()") == f"{OWNER}|127.0.0.1\n"
        with pytest.raises(AssertionError, match="password authentication failed"):
            await pg.sql("SELECT 1", password="not-" + pg.password)
        assert pg.url == f"postgresql://{OWNER}:{pg.password}@127.0.0.1:{pg.port}/postgres"
    assert not pg.process.running
    assert not pg.home.exists()
