"""The base of every configuration section, and the one error a bad configuration raises."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["ConfigError", "Section"]


class ConfigError(Exception):
    """The configuration is unusable; the message names each bad key and why."""


class Section(BaseModel):
    """A frozen section that names each unknown key as an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)
