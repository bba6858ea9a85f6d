"""A second authorization context meeting a public watch another context keeps live (invariants 2 and 16).

A context that has not proved access to a public watch with its own credential reads it first, with that
credential: its ack waits for that read, which the watch applies, so its read after the ack is fresh (16). A
context that proved access once and is refused since is left out (here: the whole listen refused, nothing else
being asked), even though the watch lives on for the others (2). Their first-context twins are in
test_coherence.py and test_left_out.py.

Raw listen streams (the kit's client), the SDK shop upstream (OAuth-protected where a token is refused), its
reads cached a minute and polled once a minute: only a subscription's own look refreshes them.
"""

from __future__ import annotations

import aiohttp
import pytest

from tests.kit import ListenStream, headers, listen_request, read_resource, rpc, serve_sidecar, text_of
from tests.kit.polling import SLOW
from tests.peers import start_upstream

PRICE = "catalog://price"

pytestmark = pytest.mark.usefixtures("tokens_never_logged")  # tests/integration/conftest.py


@pytest.mark.invariant(16)
async def test_a_second_context_listening_to_a_public_watch_another_keeps_live_reads_fresh_after_its_ack(
    http: aiohttp.ClientSession,
) -> None:
    async with (
        await start_upstream("modern", read_ttl_ms=60_000, list_ttl_ms=60_000) as up,
        serve_sidecar(up.url, polling=SLOW) as sidecar,
    ):
        keeper = ListenStream(http, sidecar.url, "keeper", [PRICE])
        await keeper.open()  # the public watch is live, polled once a minute
        try:
            assert text_of(await read_resource(http, sidecar.url, PRICE)) == "price=100"  # cached a minute
            await up.set_price(140)
            alice = ListenStream(http, sidecar.url, "alice", [PRICE], authorization="Bearer alice")
            await alice.open()  # her own first read of the watch, which the ack waits for
            try:
                # Anyone's read, first: alice's own would reach the upstream anyway (nothing cached is served to a
                # context the upstream has not answered, invariant 10), and teach the watch what it read.
                assert text_of(await read_resource(http, sidecar.url, PRICE)) == "price=140"
                assert text_of(await read_resource(http, sidecar.url, PRICE, token="alice")) == "price=140"
                await keeper.wait_update(PRICE)  # her look found the change for everyone
            finally:
                await alice.close()
        finally:
            await keeper.close()


@pytest.mark.invariant(2)
async def test_a_second_context_refused_since_it_proved_access_is_not_acknowledged_on_a_watch_another_keeps(
    http: aiohttp.ClientSession,
) -> None:
    async with (
        await start_upstream("modern", read_ttl_ms=60_000, list_ttl_ms=60_000, auth=True) as up,
        serve_sidecar(up.url, polling=SLOW) as sidecar,
    ):
        await up.grant("bob")
        await up.grant("alice")
        keeper = ListenStream(http, sidecar.url, "keeper", [PRICE], authorization="Bearer bob")
        await keeper.open()  # the public watch is live with bob's credential
        try:
            first = ListenStream(http, sidecar.url, "first", [PRICE], authorization="Bearer alice")
            await first.open()  # alice proves access with her own first read
            await first.close()
            await up.forbid("alice")
            # Alice joins the live watch: her ack waits for a look made with her credential, which is refused.
            body = listen_request([PRICE], "again")
            sent = headers("subscriptions/listen", Authorization="Bearer alice")
            async with http.post(sidecar.url, json=body, headers=sent) as resp:
                assert resp.status == 403, resp.headers  # an acknowledged stream would be a 200
                answer = await resp.json(content_type=None)
            assert answer["id"] == "again" and "error" in answer and "result" not in answer, answer
            # Bob's stream goes on: a write through the sidecar as bob makes the watch look, and he is told.
            status, _ = await rpc(
                http,
                sidecar.url,
                "tools/call",
                {"name": "set_price", "arguments": {"value": 150}},
                extra_headers={"Authorization": "Bearer bob"},
            )
            assert status == 200
            await keeper.wait_update(PRICE)
        finally:
            await keeper.close()
