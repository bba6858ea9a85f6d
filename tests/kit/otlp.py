"""A minimal OTLP/HTTP traces receiver (protobuf) on 127.0.0.1, for a sidecar process told by the standard
environment to export its spans (`OTEL_EXPORTER_OTLP_ENDPOINT`). Needs the `otel` extra: not re-exported."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.cluster import free_port

__all__ = ["otlp_receiver"]


@contextlib.asynccontextmanager
async def otlp_receiver() -> AsyncIterator[tuple[str, list[ExportTraceServiceRequest]]]:
    """The receiver's endpoint and every export it was sent, as they arrive."""
    received: list[ExportTraceServiceRequest] = []
    arrived = asyncio.Event()

    async def traces(request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        received.append(export)
        arrived.set()
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        await runner.cleanup()
