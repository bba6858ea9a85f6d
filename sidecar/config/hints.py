"""The `hints` section: the source of truth may say what changed (`POST /hints` on the admin listener)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from sidecar.config.base import Section

__all__ = ["DEFAULT_SETTLE_MS", "MAX_SETTLE_MS", "HintsConfig", "read_token"]

DEFAULT_SETTLE_MS = 3_000
"""A source whose reads lag its writes (one that re-indexes after a save) shows the change within about a second."""
MAX_SETTLE_MS = 60_000


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
    settle_ms: int = Field(
        DEFAULT_SETTLE_MS,
        ge=0,
        le=MAX_SETTLE_MS,
        description="After a hint (POST /hints, a write through the sidecar, the upstream's own notification), a "
        "watch whose look saw no change looks again 0.25, 0.5, 1, 2 s... after it, until a look sees a change or "
        "this long has passed; 0: one look per hint.",
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
