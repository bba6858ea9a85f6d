"""Configuration: frozen pydantic models loaded from YAML, with `MCP_SIDECAR__SECTION__KEY` overrides.

Each component receives its own section (`sections.py`, `upstream.py`); this module holds the whole and
how it is loaded: the file, then the environment, then command-line flags, validated once, every bad key
named (with the environment variable that set it).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, PrivateAttr, SecretStr, ValidationError, model_validator

from sidecar.config.base import ConfigError, Section
from sidecar.config.contradictions import polling_contradictions
from sidecar.config.hints import HintsConfig
from sidecar.config.revalidate import RevalidateConfig, ToolRule
from sidecar.config.sections import (
    AdminConfig,
    BusConfig,
    CacheConfig,
    ListenConfig,
    LoggingConfig,
    MetricsConfig,
    PollingConfig,
    StreamsConfig,
    TracingConfig,
)
from sidecar.config.suggest import suggestion
from sidecar.config.upstream import UpstreamConfig

__all__ = [
    "AdminConfig",
    "BusConfig",
    "CacheConfig",
    "ConfigError",
    "HintsConfig",
    "ListenConfig",
    "LoggingConfig",
    "MetricsConfig",
    "PollingConfig",
    "RevalidateConfig",
    "SidecarConfig",
    "StreamsConfig",
    "ToolRule",
    "TracingConfig",
    "UpstreamConfig",
    "load_config",
]

logger = logging.getLogger(__name__)

ENV_PREFIX = "MCP_SIDECAR__"


class SidecarConfig(Section):
    """The whole configuration; each component receives its own section."""

    listen: ListenConfig = Field(default_factory=ListenConfig)
    upstream: UpstreamConfig
    polling: PollingConfig = Field(default_factory=PollingConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    streams: StreamsConfig = Field(default_factory=StreamsConfig)
    bus: BusConfig = Field(default_factory=BusConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    admin: AdminConfig = Field(default_factory=AdminConfig)
    revalidate: RevalidateConfig = Field(default_factory=RevalidateConfig)
    hints: HintsConfig = Field(default_factory=HintsConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)

    _origins: dict[tuple[str, str], str] = PrivateAttr(default_factory=dict)
    """(section, key) -> the environment variable that set it, so a warning names what the operator wrote."""

    @model_validator(mode="before")
    @classmethod
    def _upstream_section_checked(cls, data: Any) -> Any:
        # Without an upstream section the upstream's own rule names what is missing ("set url or command"),
        # instead of a bare "field required".
        if isinstance(data, dict) and "upstream" not in data:
            return {**data, "upstream": {}}
        return data

    def warnings(self) -> list[str]:
        """What loads but deserves a word: values that contradict each other, identity headers declared otherwise."""
        return polling_contradictions(self.polling, self._key_name) + self.upstream.identity_warnings()

    def _key_name(self, dotted: str) -> str:
        section, _, key = dotted.partition(".")
        variable = self._origins.get((section, key))
        return f"{dotted} (from {variable})" if variable else dotted

    def with_overrides(self, overrides: dict[str, dict[str, Any]]) -> SidecarConfig:
        """A copy with `{section: {key: value}}` applied and validated again (see `load_config` for the upstream)."""
        data = self.model_dump(mode="python")
        _merge(data, overrides)
        return _validate(_reveal(data))


_UPSTREAM_TARGETS = ("url", "command")
_TARGET_ONLY_KEYS = {"url": ("headers", "public_url"), "command": ("env", "inherit_env", "cwd")}
"""Keys that mean something for one kind of upstream only."""


def _switch_upstream(upstream: dict[str, Any], chosen: str) -> None:
    """`chosen` (url or command) names the upstream: drop the other target, and the keys only it used."""
    other = "command" if chosen == "url" else "url"
    for key in (other, *_TARGET_ONLY_KEYS[other]):
        upstream.pop(key, None)


def _merge(data: dict[str, Any], overrides: dict[str, dict[str, Any]]) -> None:
    for section, values in overrides.items():
        target = data.setdefault(section, {})
        if not isinstance(target, dict):
            raise ConfigError(f"{section}: must be a mapping")
        chosen = [key for key in _UPSTREAM_TARGETS if values.get(key)]
        if section == "upstream" and len(chosen) == 1:
            _switch_upstream(target, chosen[0])  # an override naming the upstream replaces the one below it
        target.update(values)


def _reveal(data: Any) -> Any:
    # model_dump keeps SecretStr objects; unwrap them so validation sees plain values again.
    if isinstance(data, dict):
        return {key: _reveal(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_reveal(value) for value in data]
    if isinstance(data, SecretStr):
        return data.get_secret_value()
    return data


def load_config(
    path: str | Path | None = None,
    environ: dict[str, str] | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> SidecarConfig:
    """Read YAML (if any), apply `MCP_SIDECAR__SECTION__KEY=value` overrides, then `overrides` (command-line flags),
    validate.

    `upstream.url` and `upstream.command` are one choice: the environment or `overrides` naming either replaces
    the other from the file. Raises ConfigError whose message names every bad key.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
        # A section whose keys are all commented out reads as null: it means "all defaults".
        data = {section: {} if values is None else values for section, values in loaded.items()}
    origins: dict[tuple[str, str], str] = {}
    """(section, key) -> the environment variable that set it (named in errors; url/command choose the upstream)."""
    for key, raw in (environ if environ is not None else dict(os.environ)).items():
        if not key.startswith(ENV_PREFIX):
            continue
        parts = key[len(ENV_PREFIX) :].lower().split("__")
        if len(parts) != 2 or not all(parts):
            raise ConfigError(f"{key}: expected {ENV_PREFIX}SECTION__KEY")
        section = data.setdefault(parts[0], {})
        if not isinstance(section, dict):
            raise ConfigError(f"{parts[0]}: must be a mapping")
        # Plain text stays text (a token may hold "#" or read "no"); pydantic converts numbers and booleans.
        # Only a list or mapping needs parsing, written in YAML/JSON flow style.
        try:
            section[parts[1]] = yaml.safe_load(raw) if raw.lstrip()[:1] in ("[", "{") else raw
        except yaml.YAMLError as exc:
            raise ConfigError(f"{key}: not a valid YAML/JSON list or mapping: {' '.join(str(exc).split())}") from exc
        origins[(parts[0], parts[1])] = key
    _choose_upstream(data, {f"{section}.{key}" for section, key in origins})
    _merge(data, overrides or {})
    config = _validate(data, origins)
    config._origins = origins
    return config


def _choose_upstream(data: dict[str, Any], named: set[str]) -> None:
    # The environment naming one of url and command replaces the file's upstream (naming both is an error).
    chosen = [key for key in _UPSTREAM_TARGETS if f"upstream.{key}" in named]
    upstream = data.get("upstream")
    if len(chosen) == 1 and isinstance(upstream, dict):
        kept = {key: value for key, value in upstream.items() if f"upstream.{key}" in named}
        _switch_upstream(upstream, chosen[0])
        upstream.update(kept)


def _validate(data: dict[str, Any], origins: dict[tuple[str, str], str] | None = None) -> SidecarConfig:
    try:
        return SidecarConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = tuple(str(part) for part in error["loc"])
            key = _dotted(error["loc"]) or "(top level)"
            if error["type"] == "extra_forbidden":
                hint = suggestion(SidecarConfig, error["loc"])
                message = f"unknown key; {hint}" if hint else "unknown key"
            else:
                message = error["msg"].removeprefix("Value error, ")
            variable = (origins or {}).get((loc[0], loc[1])) if len(loc) >= 2 else None
            problems.append(f"{key}: {message}" + (f" (from {variable})" if variable else ""))
        raise ConfigError("\n".join(problems)) from exc


def _dotted(loc: tuple[int | str, ...]) -> str:
    """`polling.rules[0].match`: keys joined by dots, list positions in brackets."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text
