"""`/metrics` after a scripted session against a real SDK upstream: every family, with the values the session implies.

Parsed with prometheus_client's own text parser, as Prometheus would read it.
"""

from __future__ import annotations

import aiohttp

from sidecar import __version__
from sidecar.observability.metrics import Metrics
from tests.kit import UPDATED, WAIT_S, ListenStream, Scrape, Sidecar, eventually, rpc, scrape, serve_sidecar
from tests.peers import Upstream

PRICE = "catalog://price"
TOKEN = "s3cr3t-token"
POLLING = {"min_interval_ms": 100, "default_interval_ms": 300, "linger_ms": 100}


async def _gauge_becomes(http: aiohttp.ClientSession, sidecar: Sidecar, name: str, value: float) -> None:
    async def check() -> bool:
        return (await scrape(http, sidecar.admin_url)).value(name) == value

    await eventually(check, within_s=WAIT_S)


def _registered_families() -> dict[str, str]:
    """Every family the sidecar registers, by the name the text format gives it, with its type."""
    return {family.name: family.type for family in Metrics().registry.collect()}


async def test_a_scripted_session_shows_in_every_family(fast_upstream: Upstream, http: aiohttp.ClientSession) -> None:
    async with serve_sidecar(fast_upstream.url, polling=POLLING, streams={"max_streams": 2}) as sidecar:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for method, params, extra in [
            ("server/discover", {}, {}),
            ("resources/read", {"uri": PRICE}, {}),
            ("resources/read", {"uri": PRICE}, {}),  # fresh for 300 ms: most likely a cache hit
            ("resources/read", {"uri": "catalog://profile"}, auth),
            ("tools/list", {}, {}),
            ("tools/call", {"name": "echo", "arguments": {"text": "hi"}}, auth),
        ]:
            status, reply = await rpc(http, sidecar.url, method, params, extra_headers=extra)
            assert status == 200 and "result" in reply, reply

        first = ListenStream(http, sidecar.url, "a", [PRICE])
        second = ListenStream(http, sidecar.url, "b", [PRICE])
        try:
            for stream in (first, second):
                ack = await stream.open()
                assert ack["params"]["notifications"]["resourceSubscriptions"] == [PRICE]
            during = await scrape(http, sidecar.admin_url)
            assert during.value("mcp_sidecar_listen_streams") == 2
            assert during.value("mcp_sidecar_subscriptions") == 2
            assert during.value("mcp_sidecar_watches", kind="resource") == 1  # two streams, one watch
            status, refused = await rpc(
                http, sidecar.url, "subscriptions/listen", {"notifications": {"resourceSubscriptions": [PRICE]}}
            )
            assert status == 503, refused  # a third stream is over streams.max_streams

            await fast_upstream.set_price(120)  # out of band: only polling can see it
            for stream in (first, second):
                frame = await stream.next()
                assert frame["method"] == UPDATED and frame["params"]["uri"] == PRICE

            await first.close()
            await _gauge_becomes(http, sidecar, "mcp_sidecar_listen_streams", 1)
        finally:
            await first.close()
            await second.close()
        await _gauge_becomes(http, sidecar, "mcp_sidecar_listen_streams", 0)
        await _gauge_becomes(http, sidecar, "mcp_sidecar_subscriptions", 0)
        # The watch lingers 100 ms after its last stream, then stops.
        await eventually(
            lambda: _watches_gone(sidecar),
            within_s=WAIT_S,
        )
        final = await scrape(http, sidecar.admin_url)

    _assert_every_family_is_exposed(final)
    _assert_no_label_value_names_a_uri_or_credential(final)

    # One out-of-band change, seen once by the one watch, told to each of the two streams.
    changes = final.labelled("mcp_sidecar_changes_total")
    assert changes.pop((("kind", "resource"),)) == 1
    assert set(changes.values()) == {0}, changes
    notifications = final.labelled("mcp_sidecar_notifications_total")
    assert notifications.pop((("method", UPDATED),)) == 2
    assert set(notifications.values()) == {0}, notifications
    assert final.value("mcp_sidecar_change_delivery_seconds_count") == 2
    assert final.value("mcp_sidecar_streams_ended_total", reason="client") == 2
    assert final.value("mcp_sidecar_streams_ended_total", reason="shutdown") == 0
    assert final.value("mcp_sidecar_limit_rejections_total", limit="max_streams") == 1
    assert final.value("mcp_sidecar_listen_streams") == 0
    assert final.value("mcp_sidecar_watches", kind="resource") == 0
    polls = final.value("mcp_sidecar_polls_total", kind="resource", outcome="ok")
    assert polls is not None and polls >= 1
    assert final.value("mcp_sidecar_poll_duration_seconds_count", kind="resource") is not None

    # Requests by method (the label is the JSON-RPC method, never its URI or name).
    assert final.value("mcp_sidecar_requests_total", method="server/discover", outcome="ok") == 1
    assert final.value("mcp_sidecar_requests_total", method="resources/read", outcome="ok") == 3
    assert final.value("mcp_sidecar_requests_total", method="tools/list", outcome="ok") == 1
    assert final.value("mcp_sidecar_requests_total", method="tools/call", outcome="ok") == 1
    assert final.value("mcp_sidecar_requests_total", method="subscriptions/listen", outcome="error") == 1
    assert final.value("mcp_sidecar_request_duration_seconds_count", method="resources/read") == 3
    upstream_calls = final.value("mcp_sidecar_upstream_requests_total", method="tools/call", outcome="ok")
    assert upstream_calls == 1
    # Two reads of the same public URI within its ttlMs: at least the first missed the cache.
    hits = final.value("mcp_sidecar_cache_hits_total") or 0
    misses = final.value("mcp_sidecar_cache_misses_total") or 0
    assert misses >= 1 and hits + misses >= 3

    assert final.value("mcp_sidecar_upstream_up") == 1
    # The era is the protocol revision an operator reads in the spec, on /status and in the logs.
    assert final.value("mcp_sidecar_upstream_era_info", era="2026-07-28") == 1
    assert final.value("mcp_sidecar_upstream_era_info", era="2025-11-25") == 0
    assert set(final.labelled("mcp_sidecar_upstream_era_info")) == {(("era", "2026-07-28"),), (("era", "2025-11-25"),)}
    build = final.labelled("mcp_sidecar_build_info")
    assert len(build) == 1
    ((labels, value),) = build.items()
    assert value == 1 and dict(labels)["version"] == __version__


def _watches_gone(sidecar: Sidecar) -> bool:
    from sidecar.app import REGISTRY

    return not list(sidecar.app[REGISTRY].watches())


SESSION_FAMILIES = {
    "mcp_sidecar_requests",
    "mcp_sidecar_request_duration_seconds",
    "mcp_sidecar_upstream_requests",
    "mcp_sidecar_upstream_request_duration_seconds",
    "mcp_sidecar_upstream_up",
    "mcp_sidecar_upstream_era_info",
    "mcp_sidecar_listen_streams",
    "mcp_sidecar_stream_limit",
    "mcp_sidecar_subscriptions",
    "mcp_sidecar_watches",
    "mcp_sidecar_watched_contexts",
    "mcp_sidecar_polls",
    "mcp_sidecar_poll_duration_seconds",
    "mcp_sidecar_poll_schedule_lag_seconds",
    "mcp_sidecar_changes",
    "mcp_sidecar_notifications",
    "mcp_sidecar_signals_coalesced",
    "mcp_sidecar_change_delivery_seconds",
    "mcp_sidecar_limit_rejections",
    "mcp_sidecar_keepalives",
    "mcp_sidecar_streams_ended",
    "mcp_sidecar_cache_hits",
    "mcp_sidecar_cache_misses",
    "mcp_sidecar_cache_evictions",
    "mcp_sidecar_cache_bytes",
    "mcp_sidecar_singleflight_joins",
    "mcp_sidecar_build_info",
}
"""Families a single-process session exposes samples of (those of the Redis bus stay empty without Redis)."""


def _assert_every_family_is_exposed(final: Scrape) -> None:
    registered = _registered_families()
    assert set(registered) <= set(final.families), f"not exposed: {sorted(set(registered) - set(final.families))}"
    assert SESSION_FAMILIES <= set(registered), f"not registered: {sorted(SESSION_FAMILIES - set(registered))}"
    for name, kind in registered.items():
        assert name.startswith("mcp_sidecar_"), name
        assert final.families[name] == kind, name
    for name in SESSION_FAMILIES:
        assert any(sample.name.startswith(name) for sample in final.samples), f"{name} has no sample"


def _assert_no_label_value_names_a_uri_or_credential(final: Scrape) -> None:
    for sample in final.samples:
        for label, value in sample.labels.items():
            assert "://" not in value and "catalog" not in value, f"{sample.name}{{{label}={value!r}}}"
            assert TOKEN not in value and "Bearer" not in value, f"{sample.name}{{{label}={value!r}}}"
            assert not value.startswith("ctx-"), f"{sample.name} has a context label {value!r}"


async def test_the_stream_limit_gauge_shows_streams_max_streams(http: aiohttp.ClientSession) -> None:
    # /metrics never contacts the upstream: none needs to run.
    async with serve_sidecar("http://127.0.0.1:9/mcp", streams={"max_streams": 7}) as sidecar:
        assert (await scrape(http, sidecar.admin_url)).value("mcp_sidecar_stream_limit") == 7


async def test_a_listen_stream_the_client_closes_is_counted_as_a_request(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(fast_upstream.url, polling=POLLING) as sidecar:
        stream = ListenStream(http, sidecar.url, 1, [PRICE])
        try:
            await stream.open()
        finally:
            await stream.close()
        await _gauge_becomes(http, sidecar, "mcp_sidecar_listen_streams", 0)
        final = await scrape(http, sidecar.admin_url)
    assert final.value("mcp_sidecar_streams_ended_total", reason="client") == 1
    counted = final.labelled("mcp_sidecar_requests_total")
    assert sum(value for labels, value in counted.items() if ("method", "subscriptions/listen") in labels) == 1
