"""A URI the sidecar does not honour says why: the listen's ack names it in `_meta`, with the JSON-RPC code and
message a read of it gets, and an info line of the log counts it by reason (an identified context's URIs
hashed). A 2025-11-25 client's refused `resources/subscribe` is answered with the reason and logged the same."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from mcp import Client

from sidecar.changes import WatchKey
from sidecar.observability.naming import context_label
from sidecar.protocol.constants import META_LEFT_OUT
from tests.kit import LEGACY_HEADERS, LEGACY_INITIALIZE, ListenStream, context_of, listening, serve_sidecar
from tests.peers import Upstream, start_bare_upstream, start_upstream

PRICE = "catalog://price"
MISSING = "catalog://no-such-thing"
FORBIDDEN = "catalog://forbidden"
"""Every read of it fails upstream with -32603."""
AUTHORIZATION = "Bearer s3cr3t-token"
LISTEN_LOG = "listen left URIs out of its ack"
SUBSCRIBE_LOG = "resources/subscribe refused"


@pytest.fixture(params=["modern", "legacy"])
async def shop(request: pytest.FixtureRequest) -> AsyncIterator[Upstream]:
    async with await start_upstream(request.param) as up:
        yield up


def _logged(caplog: pytest.LogCaptureFixture, msg: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.getMessage() == msg]


def _left_out(ack: dict[str, Any]) -> list[dict[str, Any]] | None:
    meta: dict[str, Any] = ack["params"]["_meta"]
    return meta.get(META_LEFT_OUT)


@pytest.mark.invariant(2)
async def test_an_anonymous_listen_names_each_left_out_uri_with_its_error_and_the_log_counts_them(
    shop: Upstream, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar")
    async with serve_sidecar(shop.url) as sidecar:
        async with listening(ListenStream(http, sidecar.url, "l-1", [MISSING, PRICE, FORBIDDEN])) as (ack,):
            assert ack["params"]["notifications"] == {"resourceSubscriptions": [PRICE]}
            missing, forbidden = _left_out(ack) or []
            assert missing == {"uri": MISSING, "code": -32602, "message": "Resource not found"}
            # The upstream's own error for that read, as a read through the sidecar gets it: never "not found".
            assert forbidden["uri"] == FORBIDDEN and forbidden["code"] == -32603
            assert "not found" not in forbidden["message"].lower()
        # A listen that honours everything carries no such key and logs no such line.
        async with listening(ListenStream(http, sidecar.url, "l-2", [PRICE])) as (whole,):
            assert META_LEFT_OUT not in whole["params"]["_meta"]

    (line,) = _logged(caplog, LISTEN_LOG)
    assert line.levelno == logging.INFO
    assert vars(line)["subscription_id"] == "l-1" and vars(line)["context"] == "anonymous"
    assert vars(line)["left_out"] == {"not_found": 1, "upstream_error": 1}
    # The anonymous context is nobody in particular: its URIs show as they are.
    assert vars(line)["uris"] == {"not_found": [MISSING], "upstream_error": [FORBIDDEN]}


async def test_an_identified_listen_gets_its_uris_named_in_the_ack_and_hashed_in_the_log(
    shop: Upstream, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar")
    async with serve_sidecar(shop.url) as sidecar:
        stream = ListenStream(http, sidecar.url, 7, [PRICE, MISSING], authorization=AUTHORIZATION)
        async with listening(stream) as (ack,):
            assert ack["params"]["notifications"] == {"resourceSubscriptions": [PRICE]}
            # The client asked for that URI: naming it back tells it nothing it did not know.
            assert _left_out(ack) == [{"uri": MISSING, "code": -32602, "message": "Resource not found"}]
        context = context_of(sidecar, AUTHORIZATION)

    (line,) = _logged(caplog, LISTEN_LOG)
    assert vars(line)["left_out"] == {"not_found": 1}
    # The hash a private watch of that URI in that context carries on /status and in the watch's log lines.
    assert vars(line)["uris"] == {"not_found": [f"private:{WatchKey('resource', MISSING, context).short_hash}"]}
    assert vars(line)["context"] == context_label(context) != "anonymous"
    for record in caplog.records:
        assert MISSING not in str(vars(record)) and "s3cr3t" not in str(vars(record))


async def test_uris_over_the_per_stream_limit_are_named_with_the_limit(
    http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar")
    a1, a2 = "catalog://items/a1", "catalog://items/a2"
    async with (
        await start_upstream("modern") as up,
        serve_sidecar(up.url, streams={"max_uris_per_stream": 1}) as sidecar,
    ):
        async with listening(ListenStream(http, sidecar.url, 1, [PRICE, a1, a2])) as (ack,):
            assert ack["params"]["notifications"] == {"resourceSubscriptions": [PRICE]}
            left = _left_out(ack) or []
            assert [entry["uri"] for entry in left] == [a1, a2]
            for entry in left:
                assert entry["code"] == -32602 and "streams.max_uris_per_stream" in entry["message"]
    (line,) = _logged(caplog, LISTEN_LOG)
    assert vars(line)["left_out"] == {"max_uris_per_stream": 2}


@pytest.mark.invariant(2)
async def test_a_list_kind_the_upstream_lacks_is_named_and_an_sdk_client_still_reads_the_ack(
    http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar")
    async with await start_bare_upstream("modern") as up, serve_sidecar(up.url) as sidecar:  # no prompts
        async with listening(
            ListenStream(http, sidecar.url, 1, [], toolsListChanged=True, promptsListChanged=True)
        ) as (ack,):
            assert ack["params"]["notifications"] == {"toolsListChanged": True}
            assert _left_out(ack) == [
                {"notification": "promptsListChanged", "code": -32601, "message": "the upstream has no prompts"}
            ]
        # The official client takes the ack with our `_meta` key as any other.
        async with (
            Client(sidecar.url, cache=None) as client,
            client.listen(prompts_list_changed=True, resource_subscriptions=["bare://note", MISSING]) as sub,
        ):
            assert sub.honored is not None and sub.honored.resource_subscriptions == ["bare://note"]
            assert not sub.honored.prompts_list_changed
    # The upstream lacking prompts is no news on every listen; the missing URI is.
    (line,) = _logged(caplog, LISTEN_LOG)
    assert vars(line)["left_out"] == {"not_found": 1}


async def _legacy_subscribe(
    http: aiohttp.ClientSession, url: str, uris: list[str], extra: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """A 2025-11-25 client: initialize, then one resources/subscribe per URI; the answers."""
    base = {**LEGACY_HEADERS, **(extra or {})}
    async with http.post(url, json=LEGACY_INITIALIZE, headers=base) as resp:
        assert resp.status == 200, await resp.text()
        session = {**base, "Mcp-Session-Id": resp.headers["Mcp-Session-Id"], "MCP-Protocol-Version": "2025-11-25"}
    answers = []
    for number, uri in enumerate(uris, start=2):
        subscribe = {"jsonrpc": "2.0", "id": number, "method": "resources/subscribe", "params": {"uri": uri}}
        async with http.post(url, json=subscribe, headers=session) as resp:
            answers.append(await resp.json(content_type=None))
    return answers


async def test_a_2025_subscribe_refused_says_why_and_is_logged_as_a_left_out_uri(
    shop: Upstream, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar")
    async with serve_sidecar(shop.url, streams={"max_uris_per_stream": 1}) as sidecar:
        missing, forbidden, ok, over = await _legacy_subscribe(http, sidecar.url, [MISSING, FORBIDDEN, PRICE, MISSING])
        assert missing["error"] == {"code": -32002, "message": "Resource not found", "data": {"uri": MISSING}}
        assert forbidden["error"]["code"] == -32603 and "not found" not in forbidden["error"]["message"].lower()
        assert ok == {"jsonrpc": "2.0", "id": 4, "result": {}}
        assert over["error"]["code"] == -32602 and over["error"]["data"] == {"uri": MISSING}
        assert "at most 1 URIs" in over["error"]["message"]
        (hidden,) = await _legacy_subscribe(http, sidecar.url, [MISSING], {"Authorization": AUTHORIZATION})
        assert hidden["error"]["code"] == -32002
        context = context_of(sidecar, AUTHORIZATION)

    lines = _logged(caplog, SUBSCRIBE_LOG)
    assert [(vars(line)["context"], vars(line)["left_out"], vars(line)["uris"]) for line in lines] == [
        ("anonymous", {"not_found": 1}, {"not_found": [MISSING]}),
        ("anonymous", {"upstream_error": 1}, {"upstream_error": [FORBIDDEN]}),
        ("anonymous", {"max_uris_per_stream": 1}, {"max_uris_per_stream": [MISSING]}),
        (
            context_label(context),
            {"not_found": 1},
            {"not_found": [f"private:{WatchKey('resource', MISSING, context).short_hash}"]},
        ),
    ]
    assert all(line.levelno == logging.INFO for line in lines)
