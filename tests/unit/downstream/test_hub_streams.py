"""A listen stream's life in the hub, with no socket: the checks before it opens (Overloaded, a listen with no id),
the ack from what was joined (a left-out URI, a kind the upstream lacks, the probe as the client), the watches it
holds and lets go of however it ends (its client gone, stalled, max age with jitter, shutdown), keep-alive and the
log lines. A real hub and registry on the in-memory bus and the hand-moved clock."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import orjson
import pytest

from sidecar.backoff import JITTER
from sidecar.identity import ANONYMOUS_IDENTITY
from sidecar.protocol.constants import META_LEFT_OUT
from sidecar.protocol.envelope import parse_message
from sidecar.protocol.errors import InvalidParams, Overloaded, UpstreamHTTPError, UpstreamRpcError
from sidecar.protocol.frames import ack_notification, complete_result
from tests.unit.downstream.hub_world import Client, HubWorld
from tests.unit.watch.registry_world import ALICE, DOC, JUST, OTHER
from tests.unit.watch.scripted_upstream import URL, contents

Hubs = Callable[..., HubWorld]
MISSING = "file:///missing"


@pytest.mark.invariant(2)
async def test_the_ack_comes_first_and_lists_only_what_was_joined_with_the_rest_left_out(hubs: Hubs) -> None:
    hub = hubs({"resources": {}, "tools": {}})
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    hub.world.upstream.pages["tools/list"] = [{"tools": []}]
    listening = hub.listen([DOC, MISSING], "l-1", ALICE, toolsListChanged=True, promptsListChanged=True)
    assert await listening.acked() == ack_notification(
        "l-1",
        {"toolsListChanged": True, "resourceSubscriptions": [DOC]},
        [
            {"notification": "promptsListChanged", "code": -32601, "message": "the upstream has no prompts"},
            {"uri": MISSING, "code": -32602, "message": "Resource not found"},
        ],
    )
    assert hub.era.asked == [ALICE], "the upstream's capabilities are asked as the client (a first probe goes as it)"
    assert sorted(key.kind for key in hub.world.watches()) == ["resource", "tools_list"]
    assert hub.gauge("mcp_sidecar_subscriptions") == 1, "resource URIs only"
    assert hub.gauge("mcp_sidecar_listen_streams") == 1 and hub.hub.stream_count == 1
    assert listening.message.raw == {} and listening.message.params == {}, "the request's body is not kept"


@pytest.mark.invariant(2)
async def test_uris_past_the_limit_are_left_out_and_counted(hubs: Hubs) -> None:
    hub = hubs(max_uris_per_stream=1)
    for uri in (DOC, OTHER, MISSING):
        hub.world.upstream.resources[uri] = contents(uri, "v1")
    ack = await hub.listen([DOC, OTHER, MISSING], 1).acked()
    assert ack["params"]["notifications"] == {"resourceSubscriptions": [DOC]}
    assert hub.gauge("mcp_sidecar_limit_rejections_total", limit="max_uris_per_stream") == 2


async def test_a_listen_the_upstream_refuses_every_part_of_is_answered_with_the_refusal_and_holds_nothing(
    hubs: Hubs,
) -> None:
    hub = hubs()
    hub.world.upstream.failure = UpstreamHTTPError(URL, 401, "Unauthorized")
    listening = hub.listen([DOC, OTHER], 1, ALICE)
    with pytest.raises(UpstreamHTTPError):
        await listening.ended()
    assert listening.client.frames == [] and not listening.client.opened
    assert hub.hub.stream_count == 0 and hub.gauge("mcp_sidecar_listen_streams") == 0
    assert hub.gauge("mcp_sidecar_subscriptions") == 0


async def test_a_uri_whose_join_crashes_is_left_out_as_an_internal_error_and_the_others_are_joined(
    hubs: Hubs, caplog: pytest.LogCaptureFixture
) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    hub.world.upstream.resources[OTHER] = contents(OTHER, "v1")

    hub.world.upstream.pages["tools/list"] = [{"tools": []}]

    def crash_on_other() -> None:
        if hub.world.upstream.calls[-1][:2] in (("resources/read", OTHER), ("tools/list", None)):
            raise RuntimeError("a bug")

    hub.world.upstream.before_answer = crash_on_other
    ack = await hub.listen([DOC, OTHER], 1, toolsListChanged=True).acked()
    assert ack["params"]["notifications"] == {"resourceSubscriptions": [DOC]}
    assert ack["params"]["_meta"][META_LEFT_OUT] == [
        {"notification": "toolsListChanged", "code": -32603, "message": "Internal error"},
        {"uri": OTHER, "code": -32603, "message": "Internal error"},
    ]
    crashes = [record for record in caplog.records if record.getMessage() == "subscribing failed"]
    assert sorted(record.kind for record in crashes) == ["resource", "tools_list"]  # type: ignore[attr-defined]
    caplog.clear()


async def test_a_part_the_upstream_refuses_is_left_out_with_the_refusal_and_the_others_are_joined(
    hubs: Hubs,
) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    hub.world.upstream.resources[OTHER] = contents(OTHER, "v1")
    hub.world.upstream.errors["tools/list"] = {"code": -32000, "message": "tools are off today"}
    refusal = UpstreamHTTPError(URL, 403, "Forbidden")

    def refuse_other() -> None:
        if hub.world.upstream.calls[-1][:2] == ("resources/read", OTHER):
            raise refusal

    hub.world.upstream.before_answer = refuse_other
    ack = await hub.listen([DOC, OTHER], 1, toolsListChanged=True).acked()
    assert ack["params"]["notifications"] == {"resourceSubscriptions": [DOC]}
    tools_refusal = UpstreamRpcError(URL, {"code": -32000, "message": "tools are off today"}).to_rpc()
    assert ack["params"]["_meta"][META_LEFT_OUT] == [
        {"notification": "toolsListChanged", "code": tools_refusal.code, "message": tools_refusal.message},
        {"uri": OTHER, "code": refusal.to_rpc().code, "message": refusal.to_rpc().message},
    ]


async def test_a_listen_with_no_id_is_invalid_params(hubs: Hubs) -> None:
    hub = hubs()
    message = parse_message(orjson.dumps({"jsonrpc": "2.0", "method": "subscriptions/listen", "params": {}}))
    with pytest.raises(InvalidParams) as refused:
        await hub.hub.listen(message, ANONYMOUS_IDENTITY, Client())
    assert refused.value.message == "subscriptions/listen must be a request with an id"


async def test_past_max_streams_a_listen_is_overloaded_until_a_stream_ends(hubs: Hubs) -> None:
    hub = hubs(max_streams=2)
    first, second = hub.listen([], 1), hub.listen([], 2)
    await first.acked()
    await second.acked()
    with pytest.raises(Overloaded, match="already serves 2 listen streams"):
        await hub.listen([], 3).ended()
    assert hub.gauge("mcp_sidecar_limit_rejections_total", limit="max_streams") == 1
    first.task.cancel()
    await asyncio.gather(first.task, return_exceptions=True)
    assert hub.hub.stream_count == 1
    await hub.listen([], 4).acked()


@pytest.mark.invariant(13)
async def test_shutdown_ends_every_stream_with_the_complete_result_and_refuses_new_ones(hubs: Hubs) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    streams = [hub.listen([DOC], n) for n in (1, "two")]
    for listening in streams:
        await listening.acked()
    await hub.hub.close_all()
    for listening in streams:
        await listening.ended()
        assert listening.client.closed
    assert [listening.client.messages()[-1] for listening in streams] == [complete_result(1), complete_result("two")]
    assert hub.gauge("mcp_sidecar_streams_ended_total", reason="shutdown") == 2
    with pytest.raises(Overloaded) as refused:
        await hub.listen([DOC], 3).ended()
    assert refused.value.message == "the sidecar is shutting down; listen again elsewhere or after the restart"
    assert hub.world.watches() == {hub.key(DOC): 0}, "their watches let go"


async def test_a_stream_whose_client_hangs_up_lets_go_of_every_watch_it_held(hubs: Hubs) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    hub.world.upstream.pages["tools/list"] = [{"tools": []}]
    stays = hub.listen([DOC], 1)
    goes = hub.listen([DOC, OTHER], 2, toolsListChanged=True)
    hub.world.upstream.resources[OTHER] = contents(OTHER, "v1")
    await stays.acked()
    await goes.acked()
    assert hub.gauge("mcp_sidecar_subscriptions") == 3
    goes.task.cancel()  # aiohttp cancels the handler of a client that went away
    await asyncio.gather(goes.task, return_exceptions=True)
    assert hub.world.watches() == {hub.key(DOC): 1, hub.key(OTHER): 0, hub.key(None, "tools_list"): 0}
    assert hub.gauge("mcp_sidecar_subscriptions") == 1 and hub.gauge("mcp_sidecar_listen_streams") == 1
    assert hub.gauge("mcp_sidecar_streams_ended_total", reason="client") == 1


async def test_a_client_gone_before_its_ack_or_while_it_waits_ends_its_stream_quietly(hubs: Hubs) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    early = Client()
    early.gone_before_open = True
    before = hub.listen([DOC], 1, client=early)
    await before.ended()
    assert early.frames == []
    after = hub.listen([DOC], 2)
    await after.acked()
    after.client.leave()
    hub.publish(hub.key(DOC))  # wakes its driver, which finds no one to write to
    await after.ended()
    assert len(after.client.frames) == 1 and after.client.closed
    assert hub.gauge("mcp_sidecar_streams_ended_total", reason="client") == 2
    assert hub.world.watches() == {hub.key(DOC): 0}


async def test_a_client_that_stops_reading_is_ended_as_stalled_and_lets_go_of_its_watch(hubs: Hubs) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    client = Client(room=1)
    client.stalls = True
    listening = hub.listen([DOC], 1, client=client)
    await listening.acked()
    hub.publish(hub.key(DOC))
    await listening.ended()
    assert hub.gauge("mcp_sidecar_streams_ended_total", reason="stalled") == 1
    assert client.messages()[1:] == [], "no room: neither the signal nor an end frame"
    assert hub.world.watches() == {hub.key(DOC): 0} and hub.gauge("mcp_sidecar_subscriptions") == 0


@pytest.mark.parametrize(("draw", "age_s"), [(1.0, 90.0), (0.0, 100.0)])
async def test_a_stream_ends_at_its_max_age_less_up_to_a_tenth_of_jitter(
    hubs: Hubs, monkeypatch: pytest.MonkeyPatch, draw: float, age_s: float
) -> None:
    hub = hubs(max_age_s=100)
    monkeypatch.setattr(JITTER, "random", lambda: draw)
    listening = hub.listen([], 1)
    await listening.acked()
    assert hub.world.clock.advance(age_s - JUST) == 0
    assert hub.world.clock.advance(JUST) == 1
    await listening.ended()
    assert listening.client.messages()[-1] == complete_result(1)
    assert hub.gauge("mcp_sidecar_streams_ended_total", reason="max_age") == 1


async def test_a_stream_ended_before_its_max_age_leaves_no_timer_behind(hubs: Hubs) -> None:
    hub = hubs(max_age_s=100)
    listening = hub.listen([], 1)
    await listening.acked()
    assert hub.world.clock.pending() == 1
    listening.task.cancel()
    await asyncio.gather(listening.task, return_exceptions=True)
    assert hub.world.clock.pending() == 0


async def test_without_a_max_age_a_stream_lives_as_long_as_its_client(hubs: Hubs) -> None:
    hub = hubs()
    listening = hub.listen([], 1)
    await listening.acked()
    assert hub.world.clock.pending() == 0


@pytest.mark.invariant(12)
async def test_a_quiet_stream_hears_a_comment_each_keepalive_interval(hubs: Hubs) -> None:
    hub = hubs(keepalive_s=0.001)
    listening = hub.listen([], 1)
    await listening.acked()
    await listening.client.until(lambda: listening.client.frames[1:3] == [b":", b":"], "two comments")
    assert hub.gauge("mcp_sidecar_keepalives_total") >= 2


async def test_a_stream_is_logged_as_it_opens_with_what_it_left_out_and_as_it_ends(
    hubs: Hubs, caplog: pytest.LogCaptureFixture
) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    caplog.set_level(logging.INFO, logger="sidecar.downstream")
    listening = hub.listen([DOC, MISSING], "l-9")
    await listening.acked()
    listening.task.cancel()
    await asyncio.gather(listening.task, return_exceptions=True)
    lines = {record.getMessage(): record for record in caplog.records if record.name.startswith("sidecar.downstream")}
    opened = lines["listen stream opened"]
    assert (opened.subscription_id, opened.watches) == ("l-9", 1)  # type: ignore[attr-defined]
    left = lines["listen left URIs out of its ack"]
    assert (left.subscription_id, left.left_out) == ("l-9", {"not_found": 1})  # type: ignore[attr-defined]
    ended = lines["listen stream ended"]
    assert (ended.subscription_id, ended.reason) == ("l-9", "client")  # type: ignore[attr-defined]


async def test_a_listen_refused_whole_is_logged_as_ended_for_that_reason(
    hubs: Hubs, caplog: pytest.LogCaptureFixture
) -> None:
    hub = hubs()
    hub.world.upstream.failure = UpstreamHTTPError(URL, 401, "Unauthorized")
    caplog.set_level(logging.INFO, logger="sidecar.downstream")
    with pytest.raises(UpstreamHTTPError):
        await hub.listen([DOC], "r-1", ALICE).ended()
    (ended,) = [record for record in caplog.records if record.getMessage() == "listen stream ended"]
    assert (ended.subscription_id, ended.reason) == ("r-1", "refused")  # type: ignore[attr-defined]
    assert hub.gauge("mcp_sidecar_streams_ended_total", reason="refused") == 1
    assert hub.gauge("mcp_sidecar_streams_ended_total", reason="client") == 0


async def test_a_wave_of_ended_streams_logs_a_few_lines_a_second_per_reason_and_counts_the_rest(
    hubs: Hubs, caplog: pytest.LogCaptureFixture
) -> None:
    hub = hubs()
    hub.world.upstream.resources[DOC] = contents(DOC, "v1")
    caplog.set_level(logging.INFO, logger="sidecar.downstream")

    async def wave(first: int, count: int) -> None:
        streams = [hub.listen([DOC], n) for n in range(first, first + count)]
        for listening in streams:
            await listening.acked()
        for listening in streams:
            listening.task.cancel()
        await asyncio.gather(*(listening.task for listening in streams), return_exceptions=True)

    def ended() -> list[logging.LogRecord]:
        return [record for record in caplog.records if record.getMessage() == "listen stream ended"]

    await wave(0, 30)
    assert len(ended()) == 10, "a burst of ten lines, then the rest held back"
    assert hub.gauge("mcp_sidecar_streams_ended_total", reason="client") == 30, "the metric counts every one"
    hub.world.clock.advance(1.0)
    await wave(30, 1)
    last = ended()[-1]
    assert len(ended()) == 11 and last.not_logged_before == 20  # type: ignore[attr-defined]
