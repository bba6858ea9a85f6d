"""The effective configuration as it may be shown (`check-config`, the configuration log line): every value as it
is, except the secrets: header and environment values, a URL's password or credential query parameters, and those
inside a stdio command's arguments (the rule is `sidecar.masking`'s, the one every surface uses).

A password-less URL is shown whole: an operator reading `redis://db:6379/0` learns where the bus is, and a
mask there would hide the one thing worth checking."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sidecar.masking import MASK, masked_command, masked_url, secret_values

if TYPE_CHECKING:
    from sidecar.config import SidecarConfig

__all__ = ["MASK", "masked_url", "secrets_in", "shown_config"]


def shown_config(config: SidecarConfig) -> dict[str, Any]:
    """The whole configuration as plain JSON data, secrets masked (see the module's docstring)."""
    shown = config.model_dump(mode="json")  # SecretStr values (headers, env) dump as asterisks
    upstream = shown["upstream"]
    for key in ("url", "public_url"):
        if upstream.get(key):
            upstream[key] = masked_url(upstream[key])
    if upstream.get("command") is not None:
        upstream["command"] = masked_command(upstream["command"])
    shown["bus"]["redis_url"] = masked_url(config.bus.redis_url.get_secret_value())
    if shown["tracing"].get("endpoint"):
        shown["tracing"]["endpoint"] = masked_url(shown["tracing"]["endpoint"])
    return shown


def secrets_in(config: SidecarConfig) -> set[str]:
    """Every credential value `config` holds (the upstream's, the bus's, the trace exporter's), in the forms it may
    be written in, for `sidecar.masking.remember_secrets`."""
    upstream = config.upstream
    return secret_values(
        urls=(
            upstream.url,
            upstream.public_url or "",
            config.bus.redis_url.get_secret_value(),
            config.tracing.endpoint or "",
        ),
        commands=[upstream.command or []],
        values=[value.get_secret_value() for value in (*upstream.headers.values(), *upstream.env.values())],
    )
