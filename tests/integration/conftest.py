"""What the integration tests share beyond the root conftest: the check that no token reaches a log record, for
the modules that send tokens (`pytestmark = pytest.mark.usefixtures("tokens_never_logged")`)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.peers import Upstream, start_upstream

TOKENS = ("tok-Alpha.9~+/=", "alice", "bob", "u1", "u2", "u3", "alice-again")
"""Every token a test here sends: none may appear in any log record."""


@pytest.fixture
def tokens_never_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Every test runs with the sidecar logging at debug; no record (message, arguments, extra fields or
    traceback) may contain a token or the Bearer scheme."""
    caplog.set_level(logging.DEBUG)
    yield
    for record in caplog.records:
        if not record.name.startswith("sidecar"):
            continue
        text = f"{record.getMessage()} {record.exc_text or ''} {vars(record)}"
        for secret in (*TOKENS, "Bearer"):
            assert secret not in text, f"{secret!r} logged by {record.name}: {record.getMessage()}"


@pytest.fixture
async def cached_shop() -> AsyncIterator[Upstream]:
    """The shop upstream with its reads and lists cached a minute: a read stays stale unless a look refreshes it."""
    async with await start_upstream("modern", read_ttl_ms=60_000, list_ttl_ms=60_000) as up:
        yield up
