"""What `bus.redis_url` may be: one Redis (`redis://`, `rediss://`, `unix://`). Checked when the config loads, so
a wrong URL is a configuration error naming the key, not a traceback from the client at start. A Redis Cluster
(`redis+cluster://host:port,...`, sharded pub/sub) is recognised and refused as not supported yet: the layout is
ready for it (hash-tagged buckets, channels passed to scripts as keys), its client and tests are not."""

from __future__ import annotations

__all__ = ["CLUSTER_SCHEMES", "SINGLE_SCHEMES", "check_redis_url", "url_scheme"]

SINGLE_SCHEMES = ("redis", "rediss", "unix")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


def url_scheme(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def check_redis_url(url: str) -> None:
    """Raises ValueError saying what is wrong (never echoing the URL: it may hold a password)."""
    scheme = url_scheme(url)
    if scheme not in SINGLE_SCHEMES + CLUSTER_SCHEMES:
        known = ", ".join(f"{name}://" for name in SINGLE_SCHEMES)
        shown = f"{scheme}://" if scheme else "(none)"
        raise ValueError(f"unknown scheme {shown}; use one of {known}")
    if scheme in CLUSTER_SCHEMES:
        raise ValueError(f"{scheme}:// (Redis Cluster) is not supported yet; use one Redis (redis:// or rediss://)")
