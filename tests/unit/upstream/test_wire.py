"""The HTTP/1.1 wire to the upstream against a socket-level fake: answers a real server rarely sends (1xx
before the answer), and an exchange that starts while the pool is being aborted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from sidecar.protocol.errors import ShuttingDown
from sidecar.upstream.http.wire import WirePool


class _Fake:
    """Reads each request's head and body, then writes the next canned answer (none left: never answers)."""

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = answers
        self.requests = 0
        self.arrived = asyncio.Event()
        """Set when a request has arrived whole."""
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> _Fake:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                self.requests += 1
                self.arrived.set()
                if self.answers:
                    writer.write(self.answers.pop(0))
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()


@pytest.fixture
async def pool_of() -> AsyncIterator[list[WirePool]]:
    pools: list[WirePool] = []
    yield pools
    for pool in pools:
        pool.close()


def _pool(fake: _Fake, pools: list[WirePool], max_connections: int = 4) -> WirePool:
    url = f"http://127.0.0.1:{fake.port}/mcp"
    pool = WirePool(url, url, max_connections=max_connections, connect_timeout_s=5)
    pools.append(pool)
    return pool


@pytest.mark.parametrize(
    "informational",
    [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"],
    ids=["100", "103"],
)
@pytest.mark.parametrize("final", [b"200 OK", b"503 Service Unavailable"], ids=["200", "503"])
async def test_an_informational_answer_leaves_the_final_status_and_reason_as_sent(
    informational: bytes, final: bytes, pool_of: list[WirePool]
) -> None:
    answer = informational + b"HTTP/1.1 " + final + b"\r\nContent-Length: 2\r\n\r\n{}"
    async with _Fake([answer]) as fake:
        got = await _pool(fake, pool_of).exchange("POST", b"{}", {}, within_s=10)
        status, reason = final.decode().split(" ", 1)
        assert (got.status, got.reason) == (int(status), reason)
        assert await got.read() == b"{}"
        got.release()


async def test_an_exchange_waiting_for_a_connection_when_the_pool_is_aborted_ends_with_shutting_down(
    pool_of: list[WirePool],
) -> None:
    # One connection: the first exchange holds it (the fake never answers), the second waits for it. The abort
    # ends the first; the second, handed the freed slot afterwards, must not go on to the upstream.
    async with _Fake([]) as fake:
        pool = _pool(fake, pool_of, max_connections=1)
        first = asyncio.create_task(pool.exchange("POST", b"{}", {}, within_s=None))
        await fake.arrived.wait()
        fake.arrived.clear()
        second = asyncio.create_task(pool.exchange("POST", b"{}", {}, within_s=None))
        await asyncio.sleep(0)  # one loop turn: the second starts and waits for the slot
        assert not second.done()
        pool.abort_all()
        with pytest.raises(ShuttingDown):
            await first
        reached = asyncio.create_task(fake.arrived.wait())
        done, _ = await asyncio.wait({second, reached}, return_when=asyncio.FIRST_COMPLETED)
        reached.cancel()
        assert second in done, "the second exchange reached the upstream after the abort"
        with pytest.raises(ShuttingDown):
            await second
        assert fake.requests == 1
