"""A batch of observations exports exactly what the same `observe` calls would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from sidecar.observability.metrics import ObservationBatch

_BUCKETS = (0.001, 0.01, 0.1, 1.0)
_VALUES = (0.0, 0.0005, 0.001, 0.0011, 0.01, 0.05, 0.1, 0.5, 1.0, 3.0, 3.0)


def _histogram() -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    return registry, Histogram("delivery_seconds", "test", buckets=_BUCKETS, registry=registry)


def test_a_committed_batch_exports_what_one_observe_per_value_does() -> None:
    one_by_one, direct = _histogram()
    batched, histogram = _histogram()
    batch = ObservationBatch(histogram)
    for value in _VALUES:
        direct.observe(value)
        batch.observe(value)
    assert generate_latest(batched) != generate_latest(one_by_one), "nothing is added before the commit"
    batch.commit()
    batch.commit()  # a second commit adds nothing
    assert generate_latest(batched) == generate_latest(one_by_one)


def test_a_histogram_without_the_fields_it_relies_on_is_observed_one_value_at_a_time() -> None:
    observed: list[float] = []

    class Plain:
        def observe(self, value: float) -> None:
            observed.append(value)

    batch = ObservationBatch(Plain())  # type: ignore[arg-type]
    for value in _VALUES:
        batch.observe(value)
    batch.commit()
    assert observed == list(_VALUES)
