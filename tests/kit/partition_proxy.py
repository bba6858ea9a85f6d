"""A TCP proxy on 127.0.0.1 that can hold every byte, both ways, for a while: a partition as production brings it
(a dead route, a broken egress rule, a node-local DNS gone), which sends no FIN and no RST, so each side learns
of it only when its own timeout runs out.

    async with partition_proxy(redis.port) as proxy:    # point a replica at proxy.port instead of redis.port
        proxy.hold()                                      # nothing more is read or written either way
        ...
        proxy.release()                                   # the bytes held flow on, in order, on the same sockets

While held, a connection that arrives is accepted (as the kernel does) and connected onwards only once released;
bytes a side sends wait in the kernel's buffers, as on a route that drops them until it heals. A side that closes
its end meanwhile is seen to close once released. The proxy runs in the test's own event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["PartitionProxy", "partition_proxy"]

_CHUNK = 65_536


class PartitionProxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`target_port`; `hold` stops every byte both ways, `release` lets them
    flow on. `name` says which link it is in a failure message."""

    def __init__(self, target_port: int, name: str = "") -> None:
        self.target_port = target_port
        self.name = name or f"proxy to {target_port}"
        self.port = 0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def held(self) -> bool:
        return not self._flowing.is_set()

    def hold(self) -> None:
        """From now on nothing is read from or written to either side of any connection, and no new connection
        is made onwards; nothing is closed."""
        self._flowing.clear()

    def release(self) -> None:
        """Bytes flow again, those held first."""
        self._flowing.set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._links):
            task.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._link(reader, writer))
        self._links.add(task)
        task.add_done_callback(self._links.discard)

    async def _link(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self._writers.add(client_writer)
        server_writer: asyncio.StreamWriter | None = None
        try:
            await self._flowing.wait()
            try:
                server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            except OSError:
                return  # the target is down: the client sees its connection closed, as a refused one would be
            self._writers.add(server_writer)
            await asyncio.gather(self._pump(client_reader, server_writer), self._pump(server_reader, client_writer))
        finally:
            for writer in (client_writer, server_writer):
                if writer is not None:
                    self._writers.discard(writer)
                    writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One direction: each chunk waits for the link to flow before it is read, and again before it is written
        (a hold that starts while a read is pending holds that chunk too)."""
        try:
            while True:
                await self._flowing.wait()
                data = await reader.read(_CHUNK)
                await self._flowing.wait()
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            writer.close()  # one side reset: the other is closed, as a plain proxy would


@contextlib.asynccontextmanager
async def partition_proxy(target_port: int, name: str = "") -> AsyncIterator[PartitionProxy]:
    """A started proxy to `target_port`, closed (every connection through it too) when the block is left."""
    proxy = PartitionProxy(target_port, name)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.aclose()
