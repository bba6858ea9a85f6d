"""`@modelcontextprotocol/server-postgres` (npm, stdio, Node 22) as the sidecar's stdio child, on a throwaway
cluster of Debian's PostgreSQL (`tests/peers/postgres.py`), changed for real with SQL behind its back.

What a client can watch: each table of the `public` schema is a resource, `postgres://owner@host:port/<table>/schema`,
whose text is the table's columns as JSON; the resource list is the tables. The server (TypeScript SDK 1.0.1)
declares no subscriptions and announces nothing, so only the sidecar's polls see a change: DDL changes a schema,
`CREATE`/`DROP TABLE` the list; rows written change neither. Its one tool, `query`, runs SQL in a read-only
transaction and carries no annotations, so a call through the sidecar counts as a write and makes every watch
look. Its connection URL (a password in it) is on its command line, as its README runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from mcp.client.subscriptions import ResourcesListChanged, ResourceUpdated

from sidecar.app import METRICS, UPSTREAM
from tests.compat.clients import SdkMode, sdk_client, text_of, watching
from tests.compat.upstreams import OUT_OF_BAND_POLLING, OUT_OF_BAND_WITHIN_S, SLOW_POLLING, record_latency
from tests.kit import ListenStream, Sidecar, eventually, rpc
from tests.peers.postgres import Postgres, start_postgres
from tests.peers.stdio_peers import POSTGRES_VERSION, installed_version, postgres_command, serve_stdio_sidecar

pytestmark = pytest.mark.timeout(120)

MODES: list[SdkMode] = ["2026", "legacy"]
TABLES = "CREATE TABLE notes (id integer PRIMARY KEY, body text); CREATE TABLE tags (name text)"
NOTES_COLUMNS = [{"column_name": "body", "data_type": "text"}, {"column_name": "id", "data_type": "integer"}]
"""Sorted by name, as `by_name` sorts them."""
TAGS_COLUMNS = [{"column_name": "name", "data_type": "text"}]


@dataclass
class Served:
    """The cluster, the sidecar in front of server-postgres on it, and the schema resource of each table."""

    pg: Postgres
    sidecar: Sidecar
    schema: dict[str, str]
    """Table name -> its schema resource's URI, as the server lists them."""


@contextlib.asynccontextmanager
async def serve_postgres(polling: dict[str, int]) -> AsyncIterator[Served]:
    """A cluster with the tables `notes` and `tags`, and the sidecar with server-postgres on it as its child."""
    async with start_postgres() as pg:
        command = postgres_command(pg.url)
        assert installed_version(command) == POSTGRES_VERSION, "not the version .ci/install-peers pins"
        await pg.sql(TABLES)
        async with serve_stdio_sidecar(command, polling=polling) as sidecar, aiohttp.ClientSession() as http:
            status, answer = await rpc(http, sidecar.url, "resources/list")
            assert status == 200, answer
            schema = {uri.split("/")[-2]: uri for uri in (item["uri"] for item in answer["result"]["resources"])}
            assert sorted(schema) == ["notes", "tags"], answer
            yield Served(pg, sidecar, schema)


def by_name(text: str) -> list[dict[str, str]]:
    """A schema resource's columns, sorted by name: the server's query has no ORDER BY, and after DDL the
    catalog hands the columns back in another order."""
    found: list[dict[str, str]] = json.loads(text)
    return sorted(found, key=lambda column: column["column_name"])


async def columns(client: Any, uri: str) -> list[dict[str, str]]:
    """The columns `uri` reads through `client`, sorted by name."""
    return by_name(await text_of(client, uri))


@pytest.mark.parametrize("mode", MODES)
async def test_a_column_added_behind_its_back_is_heard_within_one_poll_interval(mode: SdkMode) -> None:
    async with serve_postgres(OUT_OF_BAND_POLLING) as served:
        notes = served.schema["notes"]
        info = served.sidecar.app[UPSTREAM].info
        assert info is not None and "subscribe" not in info.capabilities["resources"]  # only polls can see a change
        async with watching(served.sidecar.url, mode, notes) as watch:
            assert await columns(watch.client, notes) == NOTES_COLUMNS
            await served.pg.sql("ALTER TABLE notes ADD COLUMN tag text")
            started = asyncio.get_running_loop().time()
            await watch.updated(OUT_OF_BAND_WITHIN_S)
            record_latency(
                f"server-postgres sdk-{mode} DDL behind its back", asyncio.get_running_loop().time() - started
            )
            assert await columns(watch.client, notes) == [
                *NOTES_COLUMNS,
                {"column_name": "tag", "data_type": "text"},
            ]


@pytest.mark.invariant(22)
async def test_rows_written_leave_the_schemas_as_they_were_and_tell_nobody_a_column_added_is_told() -> None:
    # Polls come every 10 minutes: the looks here are the ones each `query` call makes (a tool without
    # annotations counts as a write), one per watched schema a call. Rows inserted change no schema: the looks
    # find both as they were. The control: a column added to `tags`, and the same call, tell `tags` only.
    async with serve_postgres(SLOW_POLLING) as served, aiohttp.ClientSession() as http:
        sidecar, notes, tags = served.sidecar, served.schema["notes"], served.schema["tags"]
        metrics = sidecar.app[METRICS]
        looks, found = metrics.polls.labels("resource", "ok"), metrics.changes.labels("resource")
        stream = await ListenStream.connect(http, sidecar.url, "postgres-1", [notes, tags])
        try:
            mark, looks_before, found_before = stream.mark(), looks._value.get(), found._value.get()
            await served.pg.sql("INSERT INTO notes VALUES (1, 'first'), (2, 'second'); INSERT INTO tags VALUES ('x')")
            assert await query(http, sidecar, "SELECT count(*) AS n FROM notes") == [{"n": "2"}]  # the rows are there
            await eventually(
                lambda: looks._value.get() >= looks_before + 2, what="a look at each schema after the call"
            )
            # A look is counted just before what it saw is weighed, in one step: a change it found is counted now.
            assert found._value.get() == found_before, "an unchanged schema was taken for a change"

            await served.pg.sql("ALTER TABLE tags ADD COLUMN weight integer")
            started = asyncio.get_running_loop().time()
            assert await query(http, sidecar, "SELECT count(*) AS n FROM tags") == [{"n": "1"}]
            frame = await stream.wait_update(tags, OUT_OF_BAND_WITHIN_S, since=mark)
            record_latency("server-postgres DDL, then a query call", asyncio.get_running_loop().time() - started)
            assert [update["params"]["uri"] for update in stream.updates(since=mark)] == [tags], frame
            status, answer = await rpc(http, sidecar.url, "resources/read", {"uri": tags})
            assert status == 200, answer
            assert by_name(answer["result"]["contents"][0]["text"]) == [
                *TAGS_COLUMNS,
                {"column_name": "weight", "data_type": "integer"},
            ]
        finally:
            await stream.close()


async def test_a_table_created_or_dropped_behind_its_back_changes_the_list_and_a_dropped_ones_schema() -> None:
    async with (
        serve_postgres(OUT_OF_BAND_POLLING) as served,
        sdk_client(served.sidecar.url, "2026") as client,
        client.listen(resource_subscriptions=[served.schema["notes"]], resources_list_changed=True) as events,
    ):
        notes = served.schema["notes"]
        await served.pg.sql("CREATE TABLE labels (name text)")
        started = asyncio.get_running_loop().time()
        async with asyncio.timeout(OUT_OF_BAND_WITHIN_S):
            assert await anext(events) == ResourcesListChanged()
        record_latency(
            "server-postgres sdk-2026 CREATE TABLE: list changed", asyncio.get_running_loop().time() - started
        )
        listed = {str(resource.uri).split("/")[-2] for resource in (await client.list_resources()).resources}
        assert listed == {"notes", "tags", "labels"}

        await served.pg.sql("DROP TABLE notes")
        async with asyncio.timeout(OUT_OF_BAND_WITHIN_S):
            told = {await anext(events), await anext(events)}  # in either order
        assert told == {ResourcesListChanged(), ResourceUpdated(uri=notes)}
        assert await columns(client, notes) == []  # a table that is gone has no columns: the server says no more
        listed = {str(resource.uri).split("/")[-2] for resource in (await client.list_resources()).resources}
        assert listed == {"tags", "labels"}

        # Its password is on the child's command line; the admin listener shows the child, not the password.
        async with aiohttp.ClientSession() as http, http.get(f"{served.sidecar.admin_url}/status") as resp:
            shown = await resp.text()
        assert f"127.0.0.1:{served.pg.port}" in shown and served.pg.password not in shown


async def query(http: aiohttp.ClientSession, sidecar: Sidecar, sql: str) -> Any:
    """The rows server-postgres's `query` tool answers for `sql`, called through the sidecar."""
    status, answer = await rpc(http, sidecar.url, "tools/call", {"name": "query", "arguments": {"sql": sql}})
    assert status == 200 and answer["result"]["isError"] is False, answer
    return json.loads(answer["result"]["content"][0]["text"])
