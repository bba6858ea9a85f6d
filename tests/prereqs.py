"""Real peers a test needs (a binary, a tool under `.tools/`): skip where they are missing, fail where CI runs.

Every skip for a missing peer goes through here, so its reason starts with `MISSING_PEER`. Locally that is
an ordinary skip (`pytest -rs` lists the reasons); under `CI=true` the hook in `tests/conftest.py` turns each
such skip into a failure, so a broken install step cannot pass green.

    redis = require_binary("redis-server")                     # in a test or fixture: its path, or a skip
    pytestmark = needs(conformance_missing())                  # a whole module: reason or None
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from tests.procs import find_binary

__all__ = ["MISSING_PEER", "in_ci", "needs", "require_binary", "skip_missing"]

MISSING_PEER = "missing real peer:"
"""The prefix of every skip reason that means "a real peer is not installed here"."""


def in_ci() -> bool:
    """True when the `CI` environment variable says so (`true`, `1` or `yes`, as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def skip_missing(reason: str) -> NoReturn:
    """Skip the running test because a real peer is missing (a failure under CI, see the module docstring)."""
    pytest.skip(f"{MISSING_PEER} {reason}")


def require_binary(name: str, *, package: str | None = None, needed_by: str = "this test") -> str:
    """The path of `name` (PATH or sbin); skips the test, naming the Debian `package`, when it is absent."""
    found = find_binary(name)
    if found is None:
        skip_missing(f"{name} is not installed (Debian package `{package or name}`); {needed_by} needs a real one")
    return found


def needs(reason: str | None) -> pytest.MarkDecorator:
    """A mark that skips (as a missing peer) when `reason` is not None, for a module's `pytestmark`."""
    return pytest.mark.skipif(reason is not None, reason=f"{MISSING_PEER} {reason}")
