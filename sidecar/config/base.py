"""The base of every configuration section, and the one error a bad configuration raises."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

__all__ = ["ConfigError", "Section"]


class ConfigError(Exception):
    """The configuration is unusable; the message names each bad key and why, one line per problem
    (`key: problem`), each printed as `mcp-sidecar: key: problem`."""


class Section(BaseModel):
    """A frozen section that names each unknown key as an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    renamed: ClassVar[dict[str, str]] = {}
    """Keys of earlier releases -> what they are called now: a file using the old name is told the new one."""

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for old, new in cls.renamed.items():
                if old in data:
                    raise ValueError(f"{old} is now {new} (counted per client: see the README's fair-share section)")
        return data
