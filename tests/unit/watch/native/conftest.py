"""What every test of the upstream's notification streams starts from: a backoff without jitter, and a bench of
either era that must end with nothing logged as failed unless the test asked for it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import pytest

from sidecar.watch import native_rules
from tests.unit.watch.native.native_harness import Bench, FixedJitter, make_bench, warnings_of


@pytest.fixture(autouse=True)
def _middle_jitter(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Backoff is its base exactly (the jitter's factor 0.5 + 0.5); tests that need another set their own."""
    monkeypatch.setattr(native_rules, "RETRY", replace(native_rules.RETRY, rand=FixedJitter(0.5).random))
    yield


@pytest.fixture
async def legacy(caplog: pytest.LogCaptureFixture) -> AsyncIterator[Bench]:
    bench = make_bench("legacy")
    yield bench
    await bench.native.aclose()
    assert warnings_of(caplog) == [], "nothing failed unless the test asked for it"


@pytest.fixture
async def modern(caplog: pytest.LogCaptureFixture) -> AsyncIterator[Bench]:
    bench = make_bench("modern")
    yield bench
    await bench.native.aclose()
    assert warnings_of(caplog) == [], "nothing failed unless the test asked for it"
