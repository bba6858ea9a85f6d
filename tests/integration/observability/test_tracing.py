"""OpenTelemetry tracing: one trace search shows a write, the poll it caused, the change and the notification;
trace context goes upstream in headers and `_meta`; request durations carry the trace id as an exemplar; and
a sidecar process exports over OTLP/HTTP to a real receiver when only the standard environment asks for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.cluster import Replica, free_port, sidecar_config
from tests.kit import ListenStream, eventually, rpc, serve_sidecar
from tests.kit.otlp import otlp_receiver
from tests.peers import Upstream, start_upstream

PRICE = "catalog://price"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


@pytest.fixture
async def shop() -> AsyncIterator[Upstream]:
    async with await start_upstream("modern", read_ttl_ms=600_000) as up:  # only a hint makes it poll
        yield up


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def _span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


async def test_one_trace_search_shows_a_write_the_poll_it_caused_the_change_and_the_notification(
    spans: InMemorySpanExporter, shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url) as sidecar:
        stream = ListenStream(http, sidecar.url, "traced", [PRICE])
        await stream.open()
        try:
            status, _ = await rpc(
                http,
                sidecar.url,
                "tools/call",
                {"name": "set_price", "arguments": {"value": 173}},
                extra_headers={"traceparent": TRACEPARENT},
            )
            assert status == 200
            assert (await stream.next())["params"]["uri"] == PRICE
            await eventually(lambda: bool(_named(spans, "notify streams")))
        finally:
            await stream.close()
    (write,) = _named(spans, "mcp tools/call")
    assert write.kind == SpanKind.SERVER and write.context is not None
    assert f"{write.context.trace_id:032x}" == CLIENT_TRACE  # the client's trace goes on through the sidecar
    assert write.parent is not None and f"{write.parent.span_id:016x}" == CLIENT_SPAN
    (exchange,) = _named(spans, "upstream tools/call")
    assert exchange.kind == SpanKind.CLIENT and exchange.parent is not None
    assert exchange.parent.span_id == _span_id(write)
    polls = [
        span for span in _named(spans, "poll") if any(link.context.span_id == _span_id(write) for link in span.links)
    ]
    assert len(polls) == 1, "the write is linked from the poll it caused"
    (poll,) = polls
    assert poll.attributes is not None and poll.attributes["mcp_sidecar.uri"] == PRICE  # a public watch names it
    (change,) = [span for span in _named(spans, "change") if span.parent and span.parent.span_id == _span_id(poll)]
    (notify,) = [s for s in _named(spans, "notify streams") if s.parent and s.parent.span_id == _span_id(change)]
    assert notify.attributes is not None and notify.attributes["mcp_sidecar.streams"] == 1
    # The upstream was handed the client span's context, in the header and in _meta.
    (call,) = [entry for entry in await shop.log() if entry["method"] == "tools/call"]
    sent = f"00-{CLIENT_TRACE}-{_span_id(exchange):016x}-01"
    assert call["traceparent"] == sent and call["meta_traceparent"] == sent, call


async def test_a_private_watch_is_traced_by_its_hash_never_its_uri(
    spans: InMemorySpanExporter, shop: Upstream, http: aiohttp.ClientSession
) -> None:
    profile = "catalog://profile"
    async with serve_sidecar(shop.url) as sidecar:
        stream = ListenStream(http, sidecar.url, "private", [profile], authorization="Bearer alice")
        await stream.open()
        try:
            await rpc(
                http,
                sidecar.url,
                "tools/call",
                {"name": "bump_profile", "arguments": {"token": "alice"}},
                extra_headers={"Authorization": "Bearer alice"},
            )
            await stream.next()
        finally:
            await stream.close()
    polls = _named(spans, "poll")
    assert polls
    for span in polls:
        assert span.attributes is not None and "mcp_sidecar.uri" not in span.attributes
        assert profile not in str(dict(span.attributes))


async def test_request_durations_carry_the_trace_id_as_an_openmetrics_exemplar(
    spans: InMemorySpanExporter, shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url) as sidecar:
        await rpc(http, sidecar.url, "resources/read", {"uri": PRICE}, extra_headers={"traceparent": TRACEPARENT})
        accept = {"Accept": "application/openmetrics-text; version=1.0.0"}
        async with http.get(f"{sidecar.admin_url}/metrics", headers=accept) as resp:
            text = await resp.text()
            assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        async with http.get(f"{sidecar.admin_url}/metrics") as resp:
            plain = await resp.text()
    lines = [line for line in text.splitlines() if line.startswith("mcp_sidecar_request_duration_seconds_bucket")]
    assert any(f'trace_id="{CLIENT_TRACE}"' in line for line in lines), lines
    assert "trace_id" not in plain  # the Prometheus text format has no exemplars


def _exported(received: list[ExportTraceServiceRequest]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for export in received:
        for resource_spans in export.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                found.extend((span.name, resource) for span in scope.spans)
    return found


async def test_the_standard_environment_alone_exports_over_otlp_http_to_a_real_receiver(
    shop: Upstream, tmp_path: Path
) -> None:
    async with otlp_receiver() as (endpoint, received):
        env = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_SERVICE_NAME": "catalog-sidecar",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        replica = Replica("traced", tmp_path / "sidecar", sidecar_config(shop.url, free_port()), env=env)
        await replica.start()
        try:
            async with aiohttp.ClientSession() as http:
                status, _ = await rpc(http, replica.url, "resources/read", {"uri": PRICE})
                assert status == 200
            await eventually(lambda: ("mcp resources/read", {"service.name": "catalog-sidecar"}) in [
                (name, {"service.name": resource.get("service.name")}) for name, resource in _exported(received)
            ], within_s=20)  # fmt: skip
        finally:
            await replica.service.stop()
