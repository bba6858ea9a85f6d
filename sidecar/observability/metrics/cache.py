"""The response cache: hits, misses, evictions, bytes held, and answers shared by identical requests."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["CacheMetrics"]


class CacheMetrics:
    """What the response cache answered, what it evicted, what it holds, and the answers shared in flight."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.cache_hits = Counter("mcp_sidecar_cache_hits", "Requests answered from the response cache", registry=r)
        self.cache_misses = Counter(
            "mcp_sidecar_cache_misses", "Cacheable requests not found in the response cache", registry=r
        )
        self.cache_evictions = Counter(
            "mcp_sidecar_cache_evictions",
            "Cache entries evicted to stay within cache.max_entries and cache.max_bytes",
            registry=r,
        )
        self.cache_bytes = Gauge("mcp_sidecar_cache_bytes", "Bytes held by the response cache", registry=r)
        self.singleflight_joins = Counter(
            "mcp_sidecar_singleflight_joins",
            "Requests that shared the answer of an identical request already in flight upstream",
            registry=r,
        )
