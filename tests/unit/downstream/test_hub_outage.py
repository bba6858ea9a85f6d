"""A listen that arrives while the upstream cannot be reached: acked with what its first reads could not reach,
each joined once the upstream can be used again and told then (a missing one told too, and not watched), tried
again, backed off, while the upstream fails once back. A real hub and registry on the hand-moved clock."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sidecar.protocol.constants import META_LEFT_OUT
from sidecar.protocol.errors import UpstreamUnavailable
from tests.unit.downstream.hub_world import HubWorld
from tests.unit.watch.registry_world import DOC, OTHER
from tests.unit.watch.scripted_upstream import URL, contents

Hubs = Callable[..., HubWorld]
DOWN = UpstreamUnavailable(URL, "cannot connect: Connection refused")
MISSING = "file:///missing"


async def test_what_cannot_be_read_during_an_outage_is_acked_and_told_once_joined(hubs: Hubs) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    hub.era.outage()
    hub.world.upstream.failure = DOWN
    listening = hub.listen([DOC, MISSING], "l-1")
    ack = await listening.acked()
    assert ack["params"]["notifications"] == {"resourceSubscriptions": [DOC, MISSING]}
    assert META_LEFT_OUT not in ack["params"]["_meta"], "nothing left out: the outage is not the URIs'"
    assert list(hub.world.watches()) == [], "nothing could be read: nothing watched yet"

    hub.world.upstream.failure = None
    hub.era.recovered()
    await listening.client.until(lambda: sorted(listening.client.updates()) == [DOC, MISSING], "both told")
    assert [key.uri for key in hub.world.watches()] == [DOC], "the missing one is told (its read says so), not held"
    assert hub.gauge("mcp_sidecar_subscriptions") == 1


async def test_a_listen_while_the_upstream_answers_still_leaves_out_what_it_could_not_read(hubs: Hubs) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    hub.world.upstream.failure = DOWN  # a fault of the moment: discovery was not remembered
    with pytest.raises(UpstreamUnavailable):
        await hub.listen([DOC], "l-1").acked()


async def test_an_upstream_that_fails_again_once_back_is_tried_again_backed_off(hubs: Hubs) -> None:
    hub = hubs()
    hub.world.upstream.resources[OTHER] = contents(OTHER, "v1")
    hub.era.outage()
    hub.world.upstream.failure = DOWN
    listening = hub.listen([OTHER], "l-1")
    await listening.acked()
    hub.era.recovered()  # said to be back, yet the read fails again
    await hub.world.clock.until_armed(hub.world.clock.armed + 1, "the next try's timer")
    hub.world.upstream.failure = None
    hub.world.clock.advance(45.0)  # past the longest first wait (1 s, jittered)
    await listening.client.until(lambda: listening.client.updates() == [OTHER], "told once joined")
    assert [key.uri for key in hub.world.watches()] == [OTHER]
