"""`UpstreamClient`: the era bridge over HTTP, what `app.py` builds when `upstream.url` is set."""

from __future__ import annotations

import ssl

from sidecar.config import CacheConfig, UpstreamConfig
from sidecar.identity import IdentityRule
from sidecar.observability.metrics import Metrics
from sidecar.upstream.bridge import UpstreamBridge
from sidecar.upstream.http.transport import HTTPTransport
from sidecar.upstream.reachability import Reachability

__all__ = ["UpstreamClient"]


class UpstreamClient(UpstreamBridge):
    """An MCP server over HTTP; every exchange tells whether it is reachable."""

    def __init__(
        self,
        config: UpstreamConfig,
        cache: CacheConfig,
        metrics: Metrics | None = None,
        identities: IdentityRule | None = None,
    ) -> None:
        # Every exchange tells reachability; while the upstream is down or unusable it is asked again on its own.
        reachability = Reachability(config.display_url, metrics or Metrics(), retry=self._ask_now)
        self._http = HTTPTransport(config, reachability, identities)
        super().__init__(self._http, reachability, cache, self._http.protection)

    def use_tls(self, context: ssl.SSLContext) -> None:
        """New connections to an https upstream use `context` (its certificate files were read again)."""
        self._http.use_tls(context)
