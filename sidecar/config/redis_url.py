"""What `bus.redis_url` may be: one Redis (`redis://`, `rediss://`, `unix://`) or a Redis Cluster's seed nodes
(`redis+cluster://[user:password@]host:port,host:port`, `rediss+cluster://` with TLS). Checked when the config
loads, so a wrong URL is a configuration error naming the key, not a traceback from the client at start."""

from __future__ import annotations

from sidecar.config.syntax import check_netloc

__all__ = ["CLUSTER_SCHEMES", "SINGLE_SCHEMES", "check_redis_url", "cluster_seeds", "url_scheme"]

SINGLE_SCHEMES = ("redis", "rediss", "unix")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


def url_scheme(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def check_redis_url(url: str) -> None:
    """Raises ValueError saying what is wrong (never echoing the URL: it may hold a password)."""
    scheme = url_scheme(url)
    if scheme not in SINGLE_SCHEMES + CLUSTER_SCHEMES:
        known = ", ".join(f"{name}://" for name in SINGLE_SCHEMES + CLUSTER_SCHEMES)
        shown = f"{scheme}://" if scheme else "(none)"
        raise ValueError(f"unknown scheme {shown}; use one of {known}")
    rest = url.split("://", 1)[1]
    if scheme == "unix":
        if not rest.split("?", 1)[0]:
            raise ValueError("unix:// needs the socket's path (unix:///run/redis.sock)")
        return
    netloc, _, path = rest.split("?", 1)[0].partition("/")
    if scheme in CLUSTER_SCHEMES:
        cluster_seeds(url)
        for seed in netloc.rpartition("@")[2].split(","):
            check_netloc(seed.strip(), port_required=True)
        return
    hostport = netloc.rpartition("@")[2]
    if hostport:  # none: the client's default, localhost:6379
        check_netloc(("localhost" if hostport.startswith(":") else "") + hostport)
    if path.strip("/") and not path.strip("/").isdigit():
        raise ValueError(f"the database {path.strip('/')!r} is not a number (redis://host:port/0)")


def cluster_seeds(url: str) -> list[tuple[str, int]]:
    """The (host, port) seed nodes of a cluster URL; raises ValueError when one is not host:port."""
    netloc = url.split("://", 1)[1].split("/", 1)[0].rpartition("@")[2]
    seeds = []
    for part in netloc.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError("each cluster seed must be host:port")
        seeds.append((host.strip("[]"), int(port)))
    return seeds
