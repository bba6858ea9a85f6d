"""Tracing with OpenTelemetry: the optional `otel` extra (`pip install ".[otel]"` in a checkout), off unless turned on.

Spans: a forwarded request (server span, its parent from the client's `traceparent` header or
`params._meta`), its exchange with the upstream (client span, whose context goes upstream in the headers and
in `params._meta`), each poll (the watch's keyed hash; the URI only when the watch is public), a detected
change (child of its poll) and the fan-out to the local streams (child of the change). A write that makes the
watches revalidate is *linked* from the polls it caused, so one trace search shows write -> poll -> change ->
notification. Off, every call here is a shared no-op context manager: the request path pays one attribute
lookup.

`tracing()` is the process's one instance (OpenTelemetry's own provider is process-wide too); `install`
replaces it: the app at start when the configuration or the standard environment asks for tracing, tests
with an in-memory exporter.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from sidecar.config import TracingConfig

if TYPE_CHECKING:
    from opentelemetry.trace import Link, Tracer

__all__ = ["MAX_LINKS", "Tracing", "TracingUnavailable", "configure_tracing", "install", "tracing"]

logger = logging.getLogger(__name__)

_TRACE_KEYS = ("traceparent", "tracestate")
"""What continues a trace. Not `baggage`: a client's baggage goes upstream only as an allowlisted header
(`upstream.forward_headers`), never through the sidecar's own propagation."""
MAX_LINKS = 8
"""Writes linked from one poll at most: a burst of writes is one round of hints."""
_OFF: contextlib.nullcontext[None] = contextlib.nullcontext()


class TracingUnavailable(Exception):
    """Tracing is asked for, but OpenTelemetry is not installed."""


class Tracing:
    """The sidecar's spans; with `tracer` None, every method is a no-op."""

    def __init__(self, tracer: Tracer | None = None, provider: Any = None) -> None:
        self._tracer = tracer
        self._provider = provider
        self.enabled = tracer is not None

    # -- the request path ---------------------------------------------------------------------------------

    def request(
        self, method: str, headers: Mapping[str, str], meta: Mapping[str, Any] | None
    ) -> contextlib.AbstractContextManager[Any]:
        """The server span of a client's request, continuing the client's trace (its `_meta` first)."""
        if self._tracer is None:
            return _OFF
        from opentelemetry import propagate
        from opentelemetry.trace import SpanKind

        carrier = {k: str(meta[k]) for k in _TRACE_KEYS if meta is not None and isinstance(meta.get(k), str)}
        if "traceparent" not in carrier:
            carrier = {k: headers[k] for k in _TRACE_KEYS if k in headers}
        parent = propagate.extract(carrier)
        return self._tracer.start_as_current_span(
            f"mcp {method}", context=parent, kind=SpanKind.SERVER, attributes={"mcp.method.name": method}
        )

    def upstream(self, method: str) -> contextlib.AbstractContextManager[Any]:
        """The client span of the exchange with the upstream; `inject` puts its context on the request."""
        if self._tracer is None:
            return _OFF
        from opentelemetry.trace import SpanKind

        return self._tracer.start_as_current_span(
            f"upstream {method}", kind=SpanKind.CLIENT, attributes={"mcp.method.name": method}
        )

    def inject(self, headers: MutableMapping[str, str], meta: MutableMapping[str, Any] | None = None) -> None:
        """The current span's context into a request to the upstream: its headers, and its `_meta` if given."""
        if self._tracer is None:
            return
        from opentelemetry import propagate

        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        if not carrier:
            return
        for key in _TRACE_KEYS:
            headers.pop(key, None)
        headers.update(carrier)
        if meta is not None:
            meta.update(carrier)

    def current_link(self) -> Link | None:
        """A link to the current span (a write, for the polls it will cause); None when off or outside one."""
        if self._tracer is None:
            return None
        from opentelemetry import trace

        context = trace.get_current_span().get_span_context()
        return trace.Link(context) if context.is_valid else None

    def trace_id(self) -> str | None:
        """The current trace's id, for a metric's exemplar; None when off or outside a span."""
        if self._tracer is None:
            return None
        from opentelemetry import trace

        context = trace.get_current_span().get_span_context()
        return f"{context.trace_id:032x}" if context.is_valid else None

    # -- the watch engine ---------------------------------------------------------------------------------

    def poll(
        self, kind: str, watch: str, uri: str | None, links: Sequence[Link] = ()
    ) -> contextlib.AbstractContextManager[Any]:
        """A poll of one watch (its keyed hash; `uri` only for a public watch), linked to the writes it follows."""
        if self._tracer is None:
            return _OFF
        attributes: dict[str, str] = {"mcp_sidecar.watch": watch, "mcp_sidecar.kind": kind}
        if uri is not None:
            attributes["mcp_sidecar.uri"] = uri
        # A poll starts a trace of its own (it serves every subscriber), linked to what asked for it.
        from opentelemetry import context as otel_context

        return self._tracer.start_as_current_span(
            "poll", context=otel_context.Context(), links=list(links)[:MAX_LINKS], attributes=attributes
        )

    def change(self, kind: str, watch: str, generation: int) -> contextlib.AbstractContextManager[Any]:
        if self._tracer is None:
            return _OFF
        attributes: dict[str, str | int] = {
            "mcp_sidecar.watch": watch,
            "mcp_sidecar.kind": kind,
            "mcp_sidecar.generation": generation,
        }
        return self._tracer.start_as_current_span("change", attributes=attributes)

    @contextlib.contextmanager
    def fanout(self, kind: str, watch: str, streams: int) -> Iterator[None]:
        if self._tracer is None:
            yield
            return
        attributes: dict[str, str | int] = {
            "mcp_sidecar.watch": watch,
            "mcp_sidecar.kind": kind,
            "mcp_sidecar.streams": streams,
        }
        with self._tracer.start_as_current_span("notify streams", attributes=attributes):
            yield

    def shutdown(self) -> None:
        """Send what is buffered and stop the exporter (at exit)."""
        if self._provider is not None:
            self._provider.shutdown()


_current = Tracing()
"""The process's tracing (off until `install`)."""


def install(replacement: Tracing) -> Tracing:
    """Make `replacement` the process's tracing; returns the one it replaces."""
    global _current
    previous, _current = _current, replacement
    return previous


def tracing() -> Tracing:
    """The process's tracing now (callers keep no copy, so `install` reaches them)."""
    return _current


def configure_tracing(config: TracingConfig, environ: Mapping[str, str] = os.environ) -> Tracing | None:
    """The tracing that `config` or the standard environment (`OTEL_TRACES_EXPORTER=otlp`, the
    `OTEL_EXPORTER_OTLP_*` variables, `OTEL_SERVICE_NAME`) asks for: OTLP over HTTP. None when neither does;
    TracingUnavailable when one does and OpenTelemetry is not installed."""
    by_environment = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "otlp"
    if not (config.enabled or by_environment):
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio
    except ImportError as exc:
        raise TracingUnavailable(
            "tracing is turned on, but OpenTelemetry is not installed: "
            'pip install ".[otel]" in the mcp-sidecar checkout (the package is installed from its source)'
        ) from exc
    service = environ.get("OTEL_SERVICE_NAME") or config.service_name
    provider = TracerProvider(
        resource=Resource.create({"service.name": service}), sampler=ParentBasedTraceIdRatio(config.sample_ratio)
    )
    exporter = OTLPSpanExporter(endpoint=config.endpoint) if config.endpoint else OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    logger.info(
        "tracing on",
        extra={"exporter": "otlp/http", "endpoint": config.endpoint or "(OTEL_EXPORTER_OTLP_*)", "service": service},
    )
    return Tracing(provider.get_tracer("mcp-sidecar"), provider)
