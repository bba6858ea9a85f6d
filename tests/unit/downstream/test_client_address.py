"""Which address a request counts against (`listen.trusted_proxies`, `listen.forwarded_header`), on requests
aiohttp builds from raw header lines, with the peer address set as a socket would give it."""

from __future__ import annotations

from unittest import mock

import pytest
from aiohttp.test_utils import make_mocked_request

from sidecar.downstream.client_address import ClientAddresses


def _request(peer: str, **headers: str) -> object:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (peer, 40000) if name == "peername" else default
    return make_mocked_request("POST", "/mcp", headers=headers, transport=transport)


@pytest.mark.parametrize(
    ("trusted", "header", "peer", "headers", "client"),
    [
        ([], "x-forwarded-for", "10.0.0.1", {"X-Forwarded-For": "192.0.2.1"}, "10.0.0.1"),  # nothing trusted
        (["10.0.0.0/8"], "x-forwarded-for", "10.0.0.1", {"X-Forwarded-For": "192.0.2.1"}, "192.0.2.1"),
        (
            ["10.0.0.0/8"],
            "x-forwarded-for",
            "10.0.0.1",
            {"X-Forwarded-For": "6.6.6.6, 192.0.2.1, 10.0.0.2"},
            "192.0.2.1",
        ),
        # The header the proxy does not write is the client's own: never read.
        (
            ["10.0.0.0/8"],
            "x-forwarded-for",
            "10.0.0.1",
            {"X-Forwarded-For": "192.0.2.1", "Forwarded": "for=6.6.6.6"},
            "192.0.2.1",
        ),
        (
            ["10.0.0.0/8"],
            "forwarded",
            "10.0.0.1",
            {"Forwarded": 'for="[2001:db8::1]:4711"', "X-Forwarded-For": "6.6.6.6"},
            "2001:db8::1",
        ),
        # A dual-stack listener sees an IPv4 proxy as an IPv4-mapped IPv6 address.
        (["10.0.0.0/8"], "x-forwarded-for", "::ffff:10.0.0.1", {"X-Forwarded-For": "192.0.2.1"}, "192.0.2.1"),
        (["10.0.0.0/8"], "x-forwarded-for", "192.0.2.7", {"X-Forwarded-For": "6.6.6.6"}, "192.0.2.7"),  # untrusted peer
    ],
)
def test_the_client_is_the_first_untrusted_hop_of_the_header_the_proxies_write(
    trusted: list[str], header: str, peer: str, headers: dict[str, str], client: str
) -> None:
    assert ClientAddresses(trusted, header).of(_request(peer, **headers)) == client  # type: ignore[arg-type]
