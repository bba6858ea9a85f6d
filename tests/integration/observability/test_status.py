"""`GET /status` shows the watches that exist, as JSON and as an HTML page, and never a credential."""

from __future__ import annotations

from html.parser import HTMLParser

import aiohttp

from sidecar import __version__
from sidecar.app import REGISTRY
from sidecar.observability.logs import INSTANCE_ID
from tests.kit import WAIT_S, ListenStream, Sidecar, context_of, eventually, listening, serve_sidecar
from tests.peers import Upstream, start_upstream

PRICE = "catalog://price"
PROFILE = "catalog://profile"
TOKEN = "s3cr3t-token"
AUTHORIZATION = f"Bearer {TOKEN}"
COLUMNS = [
    "kind",
    "uri",
    "context",
    "mode",
    "interval_ms",
    "last_poll",
    "last_change",
    "consecutive_errors",
    "subscribers",
]
POLLING = {"min_interval_ms": 100, "default_interval_ms": 300, "linger_ms": 100}


class _Tables(HTMLParser):
    """The rows of every table on a page, as lists of cell texts (header rows included)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.text: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


async def _status_json(http: aiohttp.ClientSession, sidecar: Sidecar) -> tuple[str, dict[str, object]]:
    async with http.get(f"{sidecar.admin_url}/status") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/json")
        text = await resp.text()
        return text, await resp.json()


async def _status_html(http: aiohttp.ClientSession, sidecar: Sidecar) -> str:
    async with http.get(f"{sidecar.admin_url}/status", headers={"Accept": "text/html,*/*;q=0.8"}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/html")
        return await resp.text()


async def test_status_lists_the_watches_that_exist_without_credentials(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(fast_upstream.url, polling=POLLING) as sidecar:
        streams = [
            ListenStream(http, sidecar.url, 1, [PRICE]),
            ListenStream(http, sidecar.url, 2, [PRICE, PROFILE], authorization=AUTHORIZATION),
            ListenStream(http, sidecar.url, 3, [], toolsListChanged=True),
        ]
        async with listening(*streams):
            # Wait for one poll of each watch, so last_poll is a time on both pages.
            await eventually(
                lambda: all(watch.last_poll_at is not None for watch in sidecar.app[REGISTRY].watches()),
                within_s=WAIT_S,
            )
            raw, status = await _status_json(http, sidecar)
            page = await _status_html(http, sidecar)

    for text in (raw, page):
        assert TOKEN not in text and "Bearer" not in text
        assert context_of(sidecar, AUTHORIZATION) not in text  # not even the context's keyed hash: only a short name

    assert status["version"] == __version__ and status["instance"] == INSTANCE_ID
    assert status["ready"] is True
    assert status["upstream"] == {
        "url": fast_upstream.url,
        "era": "2026-07-28",
        "up": True,
        "usable": True,
        "not_ready_reason": None,
        "last_error": None,
    }
    assert status["counts"] == {"streams": 3, "watches": 3, "contexts": 2}
    watches = status["watches"]
    assert isinstance(watches, list) and status["watches_shown"] == 3
    by_uri = {(watch["kind"], watch["uri"]): watch for watch in watches}
    # A private URI may name a person: it shows only as its watch's keyed hash.
    (private,) = [uri for kind, uri in by_uri if kind == "resource" and uri != PRICE]
    assert private.startswith("private:") and PROFILE not in raw and PROFILE not in page
    assert set(by_uri) == {("resource", PRICE), ("resource", private), ("tools_list", None)}

    price, profile, tools = by_uri["resource", PRICE], by_uri["resource", private], by_uri["tools_list", None]
    assert (price["context"], price["subscribers"]) == ("public", 2)  # one watch shared by both streams
    assert (tools["context"], tools["subscribers"]) == ("public", 1)
    # The private profile is watched in the caller's own context, named by a short hash.
    assert profile["subscribers"] == 1
    assert profile["context"] != "public"
    assert len(profile["context"]) == 8 and all(c in "0123456789abcdef" for c in profile["context"])
    assert profile["context"] not in context_of(sidecar, AUTHORIZATION)  # a hash of the context, not a piece of it
    for watch in watches:
        assert list(watch) == COLUMNS
        assert watch["consecutive_errors"] == 0
        assert watch["last_poll"] is not None and watch["last_poll"].endswith("Z")
        assert 100 <= watch["interval_ms"] <= 400  # ttlMs 300 with jitter
    assert watches[0] == price  # the most subscribed first

    # The page shows the same watches, cell for cell (interval_ms is jittered on each render).
    tables = _Tables()
    tables.feed(page)
    header, *rows = tables.rows
    assert header == COLUMNS
    shown = {(row[0], row[1]): row for row in rows}
    assert len(shown) == len(rows) == 3
    for watch in watches:
        row = shown[watch["kind"], watch["uri"] or ""]
        expected = ["" if watch[column] is None else str(watch[column]) for column in COLUMNS]
        interval = COLUMNS.index("interval_ms")
        assert row[:interval] + row[interval + 1 :] == expected[:interval] + expected[interval + 1 :]
    text = " ".join(tables.text)
    assert f"mcp-sidecar {__version__}" in text and INSTANCE_ID in text
    assert "3 streams, 3 watches, 2 contexts" in text
    assert fast_upstream.url in text and "era 2026-07-28" in text


async def test_status_page_escapes_what_it_shows(fast_upstream: Upstream, http: aiohttp.ClientSession) -> None:
    uri = "catalog://items/a\"b'c"  # the shop's template accepts quotes (not < or &)
    async with serve_sidecar(fast_upstream.url, polling=POLLING) as sidecar:
        async with listening(ListenStream(http, sidecar.url, 1, [uri])) as (ack,):
            assert ack["params"]["notifications"]["resourceSubscriptions"] == [uri]
            page = await _status_html(http, sidecar)
    assert uri not in page
    assert "catalog://items/a&quot;b&#x27;c" in page


async def test_on_a_2025_upstream_anonymous_watches_show_their_uris_and_identified_ones_stay_hashed(
    http: aiohttp.ClientSession,
) -> None:
    """Every result of a 2025-11-25 upstream is private (it has no cacheScope), so every watch is one context's.
    The anonymous context is nobody in particular: its URIs show. A user's stay hashed, under one context name."""
    item = "catalog://items/a1"
    async with (
        await start_upstream("legacy", read_ttl_ms=300, list_ttl_ms=300) as legacy,
        serve_sidecar(legacy.url, polling=POLLING) as sidecar,
    ):
        streams = [
            ListenStream(http, sidecar.url, 1, [PRICE, item]),
            ListenStream(http, sidecar.url, 2, [PRICE, PROFILE], authorization=AUTHORIZATION),
        ]
        async with listening(*streams) as acks:
            for ack in acks:
                assert len(ack["params"]["notifications"]["resourceSubscriptions"]) == 2
            raw, status = await _status_json(http, sidecar)
            page = await _status_html(http, sidecar)

    assert isinstance(status["upstream"], dict) and status["upstream"]["era"] == "2025-11-25"
    assert "era 2025-11-25" in page
    watches = status["watches"]
    assert isinstance(watches, list) and len(watches) == 4
    anonymous = [watch for watch in watches if watch["context"] == "anonymous"]
    identified = [watch for watch in watches if watch["context"] != "anonymous"]
    assert sorted(watch["uri"] for watch in anonymous) == [item, PRICE]
    assert len(identified) == 2
    (context,) = {watch["context"] for watch in identified}  # one context, one name, for all its watches
    assert len(context) == 8 and all(c in "0123456789abcdef" for c in context)
    for watch in identified:
        assert watch["uri"].startswith("private:"), watch
    assert len({watch["uri"] for watch in identified}) == 2
    # The user's profile never shows; the price shows only for the anonymous watch, once on the page.
    for text in (raw, page):
        assert PROFILE not in text and TOKEN not in text and context_of(sidecar, AUTHORIZATION) not in text
    assert raw.count(PRICE) == 1
