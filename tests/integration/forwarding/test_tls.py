"""TLS on both legs, with a private CA made by trustme: clients reach the sidecar over HTTPS (optionally with a
client certificate), and the sidecar reaches an https SDK upstream that trusts only that CA's client
certificates. Certificates rotate without a restart and without dropping streams.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from cryptography import x509
from pydantic import ValidationError

from sidecar.app import CONFIG, UPSTREAM
from sidecar.config.tls import ListenerTLS
from sidecar.tls import CertificateWatch, server_context
from tests.cluster import Replica, free_port, sidecar_config
from tests.kit import ListenStream, eventually, make_config, rpc, serve_sidecar
from tests.peers import PeerTLS, Upstream, start_upstream

PRICE = "catalog://price"


@dataclass(frozen=True)
class Pki:
    """One private CA's files: a server certificate for 127.0.0.1 and a client certificate, plus another CA
    that signed nothing the tests trust."""

    ca: trustme.CA
    ca_file: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca_file: Path

    def client_context(self, *, with_certificate: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if with_certificate:
            context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context

    def issue_server(self, directory: Path) -> tuple[Path, Path]:
        """A fresh server certificate for 127.0.0.1 (another serial number), written into `directory`."""
        leaf = self.ca.issue_cert("127.0.0.1", "localhost")
        cert, key = directory / "server.pem", directory / "server.key"
        leaf.cert_chain_pems[0].write_to_path(str(cert))
        for blob in leaf.cert_chain_pems[1:]:
            blob.write_to_path(str(cert), append=True)
        leaf.private_key_pem.write_to_path(str(key))
        return cert, key


@pytest.fixture
def pki(tmp_path: Path) -> Iterator[Pki]:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server_cert, server_key = tmp_path / "upstream.pem", tmp_path / "upstream.key"
    server.private_key_and_cert_chain_pem.write_to_path(str(server_cert))
    server.private_key_pem.write_to_path(str(server_key))
    client = ca.issue_cert("mcp-sidecar")
    client_cert, client_key = tmp_path / "client.pem", tmp_path / "client.key"
    client.cert_chain_pems[0].write_to_path(str(client_cert))
    client.private_key_pem.write_to_path(str(client_key))
    other_ca_file = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca_file))
    yield Pki(ca, ca_file, server_cert, server_key, client_cert, client_key, other_ca_file)


@pytest.fixture
async def https_upstream(pki: Pki) -> AsyncIterator[Upstream]:
    """The SDK shop server over HTTPS, requiring a client certificate from the private CA."""
    tls = PeerTLS(pki.server_cert, pki.server_key, pki.client_context(with_certificate=True), client_ca=pki.ca_file)
    async with await start_upstream("modern", read_ttl_ms=300, tls=tls) as up:
        yield up


def _upstream_tls(pki: Pki, ca_file: Path | None = None) -> dict[str, Any]:
    return {
        "ca_file": str(ca_file or pki.ca_file),
        "client_cert_file": str(pki.client_cert),
        "client_key_file": str(pki.client_key),
    }


async def test_an_https_upstream_with_a_private_ca_and_a_client_certificate_serves_reads_polls_and_listens(
    pki: Pki, https_upstream: Upstream
) -> None:
    listen_tls = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}
    connector = aiohttp.TCPConnector(ssl=pki.client_context())
    async with (
        serve_sidecar(https_upstream.url, upstream={"tls": _upstream_tls(pki)}, listen={"tls": listen_tls}) as sidecar,
        aiohttp.ClientSession(connector=connector) as https,
    ):
        assert sidecar.url.startswith("https://")
        status, message = await rpc(https, sidecar.url, "resources/read", {"uri": PRICE})
        assert status == 200 and "result" in message, message
        stream = ListenStream(https, sidecar.url, "tls", [PRICE])
        ack = await stream.open()
        try:
            assert ack["params"]["notifications"]["resourceSubscriptions"] == [PRICE]
            await https_upstream.set_price(171)  # seen by a poll over the upstream's TLS, told over the client's
            update = await stream.next()
            assert update["params"]["uri"] == PRICE
            status, message = await rpc(https, sidecar.url, "resources/read", {"uri": PRICE})
            assert "171" in message["result"]["contents"][0]["text"]
        finally:
            await stream.close()
        log = await https_upstream.log()
        assert log, "the upstream saw no request"


@pytest.mark.parametrize("fault", ["wrong-ca", "no-client-certificate"])
async def test_a_tls_failure_towards_the_upstream_is_not_ready_with_a_clear_reason(
    fault: str, pki: Pki, https_upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    tls = _upstream_tls(pki, pki.other_ca_file) if fault == "wrong-ca" else {"ca_file": str(pki.ca_file)}
    async with aiohttp.ClientSession() as http:
        with caplog.at_level(logging.WARNING, logger="sidecar"):
            async with serve_sidecar(https_upstream.url, upstream={"tls": tls}) as sidecar:
                async with http.get(f"{sidecar.admin_url}/readyz") as resp:  # the listener that says why
                    body = await resp.json()
                status, message = await rpc(http, sidecar.url, "resources/read", {"uri": PRICE})
    assert resp.status == 503, body
    assert status == 502, message
    reasons = [str(getattr(r, "reason", "")) for r in caplog.records if r.getMessage() == "upstream unreachable"]
    if fault == "wrong-ca":
        assert "certificate verify failed" in str(body), body
        # Whole: the words saying which check failed come last in OpenSSL's text, and name where to look.
        # (OpenSSL's "self-signed certificate in certificate chain" here; "unable to get local issuer certificate"
        # for a server certificate alone), never cut before them.
        assert any(
            "certificate verify failed: self-signed certificate in certificate chain (the upstream's certificate "
            "must chain to upstream.tls.ca_file" in reason
            for reason in reasons
        ), reasons
    else:  # the upstream ends the handshake or the connection: named, never a bare "internal error"
        assert body.get("reason") and reasons, (body, reasons)


async def test_clients_without_a_certificate_from_the_client_ca_are_refused_on_a_mutual_tls_listener(
    pki: Pki, https_upstream: Upstream
) -> None:
    listen_tls = {
        "cert_file": str(pki.server_cert),
        "key_file": str(pki.server_key),
        "client_ca_file": str(pki.ca_file),
    }
    async with serve_sidecar(
        https_upstream.url, upstream={"tls": _upstream_tls(pki)}, listen={"tls": listen_tls}
    ) as sidecar:
        with_certificate = aiohttp.TCPConnector(ssl=pki.client_context(with_certificate=True))
        async with aiohttp.ClientSession(connector=with_certificate) as https:
            status, _ = await rpc(https, sidecar.url, "resources/read", {"uri": PRICE})
            assert status == 200
        without = aiohttp.TCPConnector(ssl=pki.client_context())
        async with aiohttp.ClientSession(connector=without) as https:
            with pytest.raises(aiohttp.ClientError):
                await rpc(https, sidecar.url, "resources/read", {"uri": PRICE})


class _HttpsReplica(Replica):
    """A sidecar process whose MCP port serves HTTPS (its admin port stays plain)."""

    def __init__(self, name: str, workdir: Path, config: dict[str, Any], context: ssl.SSLContext) -> None:
        super().__init__(name, workdir, config)
        self.context = context

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def _get(self, path: str, *, admin: bool = False) -> tuple[int, str]:
        base = f"http://127.0.0.1:{self.admin_port}" if admin else self.base_url
        connector = aiohttp.TCPConnector(force_close=True, ssl=False if admin else self.context)
        async with aiohttp.ClientSession(connector=connector) as http, http.get(base + path) as resp:
            return resp.status, await resp.text()


async def _served_serial(port: int, context: ssl.SSLContext) -> int:
    """The serial number of the certificate a new connection to `port` is shown."""
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
    return _serial(der)


def _serial(der: bytes) -> int:
    return x509.load_der_x509_certificate(der).serial_number


async def test_a_rotated_listener_certificate_reaches_new_connections_on_sighup_and_open_streams_stay(
    pki: Pki, https_upstream: Upstream, tmp_path: Path
) -> None:
    certs = tmp_path / "listener"
    certs.mkdir()
    cert, key = pki.issue_server(certs)
    config = sidecar_config(
        https_upstream.url,
        free_port(),
        listen={"tls": {"cert_file": str(cert), "key_file": str(key)}},
        upstream={"tls": _upstream_tls(pki)},
    )
    replica = _HttpsReplica("tls-sidecar", tmp_path / "sidecar", config, pki.client_context())
    await replica.start()
    try:
        context = pki.client_context()
        first = await _served_serial(replica.port, context)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as https:
            stream = await ListenStream.connect(https, replica.url, "before", [PRICE])
            try:
                pki.issue_server(certs)  # the files are replaced in place, as a mounted Secret is
                await replica.service.signal(signal.SIGHUP)
                await eventually(
                    lambda: any(
                        e.get("msg") == "certificate files loaded" and e.get("tls") == "listen"
                        for e in replica.log_lines()
                    )
                )
                second = await _served_serial(replica.port, context)
                assert second != first
                mark = stream.mark()
                await https_upstream.set_price(172)
                update = await stream.wait_update(PRICE, within_s=15, since=mark)  # the stream opened before goes on
                assert update["params"]["uri"] == PRICE
            finally:
                await stream.aclose()
    finally:
        await replica.service.stop()


async def test_a_changed_upstream_ca_file_takes_effect_for_new_connections_without_a_restart(
    pki: Pki, https_upstream: Upstream, tmp_path: Path
) -> None:
    # The sidecar starts trusting the wrong CA; the right bundle is then written into the same file.
    ca_file = tmp_path / "trusted.pem"
    ca_file.write_bytes(pki.other_ca_file.read_bytes())
    tls = {**_upstream_tls(pki), "ca_file": str(ca_file)}
    async with serve_sidecar(https_upstream.url, upstream={"tls": tls}) as sidecar, aiohttp.ClientSession() as http:
        watch = CertificateWatch()  # what `mcp-sidecar run` sets up (and checks every few seconds)
        watch.upstream(sidecar.app[CONFIG].upstream.tls, sidecar.app[UPSTREAM].use_tls)
        status, _ = await rpc(http, sidecar.url, "resources/read", {"uri": PRICE})
        assert status == 502
        ca_file.write_bytes(pki.ca_file.read_bytes())
        os.utime(ca_file, ns=(time.time_ns(), time.time_ns() + 1_000_000_000))  # a later modification time
        watch.check()
        status, message = await rpc(http, sidecar.url, "resources/read", {"uri": PRICE})
        assert status == 200, message


def test_tls_settings_that_cannot_work_fail_at_start_naming_the_key(pki: Pki) -> None:
    cases = [
        ({"upstream": {"tls": {"ca_file": str(pki.ca_file)}}}, "upstream.tls is for an https:// url"),
        ({"listen": {"tls": {"cert_file": str(pki.server_cert)}}}, "cert_file and key_file go together"),
        (
            {"listen": {"tls": {"cert_file": "/nonexistent.pem", "key_file": str(pki.server_key)}}},
            "not a readable file",
        ),
    ]
    for sections, message in cases:
        with pytest.raises(ValidationError) as failed:
            make_config("http://127.0.0.1:9/mcp", **sections)
        assert message in str(failed.value), (sections, failed.value)


async def test_a_half_written_certificate_pair_is_refused_and_the_one_in_use_keeps_serving(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cert, key = pki.issue_server(tmp_path)
    tls = ListenerTLS(cert_file=str(cert), key_file=str(key))
    context = server_context(tls)
    assert context is not None
    watch = CertificateWatch()
    watch.listener("listen", context, tls)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    try:
        first = await _served_serial(port, pki.client_context())
        old_key = key.read_bytes()
        pki.issue_server(tmp_path)  # a new pair ...
        renewed_key = key.read_bytes()
        key.write_bytes(old_key)  # ... of which only the certificate has arrived
        with caplog.at_level(logging.ERROR, logger="sidecar.tls"):
            watch.reload()
        assert [r.getMessage() for r in caplog.records] == [
            "certificate files could not be loaded; the ones in use are kept"
        ]
        assert await _served_serial(port, pki.client_context()) == first  # still served, still the old one
        key.write_bytes(renewed_key)  # the rest arrives
        watch.reload()
        assert await _served_serial(port, pki.client_context()) != first
    finally:
        server.close()
        await server.wait_closed()
