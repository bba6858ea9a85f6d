"""Who hears that the upstream can be used again: every listener registered, each as often as it was added, until
its remover is called (a closed watch registry must not be told, a second one must be)."""

from __future__ import annotations

from sidecar.observability.metrics import Metrics
from sidecar.upstream.answers import UpstreamInfo
from sidecar.upstream.reachability import Reachability

INFO = UpstreamInfo("legacy", {"resources": {}}, None, None)


def test_each_listener_is_told_of_every_recovery_until_it_is_removed() -> None:
    reach = Reachability("stdio: server", Metrics())
    told: list[str] = []

    def first() -> None:
        told.append("first")

    def second() -> None:
        told.append("second")

    remove_first = reach.add_recovery_listener(first)
    remove_second = reach.add_recovery_listener(second)
    remove_second_again = reach.add_recovery_listener(second)  # added twice: told twice, removed once per adding
    reach.handshake_answered(INFO)
    assert told == [], "a first handshake is no recovery"
    reach.not_answering("the child exited (code 1)", down=True)
    reach.handshake_answered(INFO)
    assert sorted(told) == ["first", "second", "second"]

    told.clear()
    remove_second()
    remove_second()  # a remover may be called again: it removes nothing more
    reach.handshake_answered(INFO)
    assert sorted(told) == ["first", "second"]

    told.clear()
    remove_first()
    remove_second_again()
    reach.handshake_answered(INFO)
    assert told == [], "nobody is left to tell"
