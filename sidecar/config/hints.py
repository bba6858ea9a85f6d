"""The `hints` section: the source of truth may say what changed (`POST /hints` on the admin listener)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from sidecar.config.base import Section

__all__ = ["HintsConfig", "read_token"]


def read_token(path: str) -> str:
    """The bearer token a file holds (surrounding whitespace, a trailing newline say, is not part of it); raises
    ValueError naming the problem when the file cannot be read or holds none."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text") from exc
    if not token:
        raise ValueError(f"{path} is empty: it must hold the bearer token")
    if any(char.isspace() or not char.isprintable() for char in token):
        raise ValueError(f"{path} must hold one token, without spaces or line breaks inside it")
    return token


class HintsConfig(Section):
    token_file: str | None = Field(
        None,
        description="File holding the bearer token of POST /hints on the admin listener (read again on SIGHUP); "
        "unset: no such endpoint.",
    )

    @field_validator("token_file")
    @classmethod
    def _token_file(cls, value: str | None) -> str | None:
        if value is not None:
            read_token(value)
        return value

    @property
    def enabled(self) -> bool:
        return self.token_file is not None
