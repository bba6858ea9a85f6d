"""The names a few modules still import from here; they live in `tests.kit` now (import them from there)."""

from __future__ import annotations

from tests.kit import *  # noqa: F403
from tests.kit import __all__ as __all__
