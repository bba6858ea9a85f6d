"""Which baselines go upstream at once: the memory of missing resources, and each client's rate of first reads."""

from __future__ import annotations

from sidecar.watch.admission import Admission


class _Clock:
    def __init__(self) -> None:
        self.time = 100.0

    def __call__(self) -> float:
        return self.time


def test_a_missing_resource_is_remembered_for_its_context_until_the_ttl_passes() -> None:
    clock = _Clock()
    admission = Admission(absent_ttl_s=5.0, rate_per_s=1.0, clock=clock)
    assert not admission.known_absent("resource", "x://gone", "alice")
    admission.absent("resource", "x://gone", "alice")
    assert admission.known_absent("resource", "x://gone", "alice")
    assert not admission.known_absent("resource", "x://gone", "bob"), "another context reads it for itself"
    assert not admission.known_absent("resources_list", "x://gone", "alice")
    clock.time += 4.999
    assert admission.known_absent("resource", "x://gone", "alice")
    clock.time += 0.001
    assert not admission.known_absent("resource", "x://gone", "alice")


def test_a_read_that_finds_a_resource_forgets_only_that_contexts_record_of_it() -> None:
    admission = Admission(absent_ttl_s=60.0, rate_per_s=1.0, clock=_Clock())
    for context in ("alice", "bob"):
        admission.absent("resource", "x://1", context)
    admission.absent("resource", "x://2", "alice")
    admission.present("x://1", "alice")
    admission.present("x://never-missing", "alice")
    assert not admission.known_absent("resource", "x://1", "alice")
    assert admission.known_absent("resource", "x://1", "bob")
    assert admission.known_absent("resource", "x://2", "alice")


def test_a_changed_resource_list_forgets_every_missing_resource() -> None:
    admission = Admission(absent_ttl_s=60.0, rate_per_s=1.0, clock=_Clock())
    admission.absent("resource", "x://1", "alice")
    admission.absent("resources_list", None, "bob")
    admission.present()
    assert not admission.known_absent("resource", "x://1", "alice")
    assert not admission.known_absent("resources_list", None, "bob")


def test_each_client_starts_its_rate_of_baselines_a_second_and_saves_up_no_more_than_that() -> None:
    clock = _Clock()
    admission = Admission(absent_ttl_s=60.0, rate_per_s=2.0, clock=clock)
    assert [admission.take("alice") for _ in range(3)] == [True, True, False]
    assert admission.take("bob"), "every client has a bucket of its own"
    clock.time += 0.5  # one token back at 2 a second
    assert [admission.take("alice") for _ in range(2)] == [True, False]
    clock.time += 3600.0  # an idle hour saves up one second's worth, not an hour's
    assert [admission.take("alice") for _ in range(3)] == [True, True, False]
