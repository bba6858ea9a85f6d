"""The registry as its driver tests call it: a caller's `acquire` bounded, and ended at once by a look that crashed.

A look of the registry (`_look`, `_publish_first`) catches whatever its I/O raises and hands it to the engine; a
look task that still ends with an error is a bug in how the engine's answer was carried out (a broken engine: a
mutant of it), and its callers would wait for an answer that never comes. Without this, such a test hangs until
mutmut's wall-clock limit (about 50 s a mutant); with it, it fails as soon as the look has crashed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sidecar.changes import WatchKind
from sidecar.identity import Identity
from sidecar.watch.handles import Handle
from sidecar.watch.registry import WatchRegistry
from tests.kit import WAIT_S

__all__ = ["BoundedRegistry"]

_LOOKS = ("._look", "._publish_first", "PollTasks._poll")
"""The registry's own tasks (its looks, first publishes and polls) that never end with an error when all is well: they
catch what their I/O raises."""


class BoundedRegistry(WatchRegistry):
    """A `WatchRegistry` whose callers wait at most the kit's bound, and not at all once one of its looks crashed
    (in their own task: a caller cancelled, or answered as it is cancelled, goes the registry's own way)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.crashed: BaseException | None = None
        self._callers: set[asyncio.Task[Any]] = set()
        loop = asyncio.get_running_loop()
        previous = loop.get_task_factory()

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **options: Any) -> asyncio.Future[Any]:
            task = previous(loop, coro, **options) if previous is not None else asyncio.Task(coro, loop=loop, **options)
            if getattr(coro, "__qualname__", "").endswith(_LOOKS):
                task.add_done_callback(self._ended)
            return task

        loop.set_task_factory(factory)

    def _ended(self, task: asyncio.Future[Any]) -> None:
        if task.cancelled() or (error := task.exception()) is None or self.crashed is not None:
            return
        self.crashed = error
        for caller in self._callers:
            caller.cancel()  # each one then fails with the crash (below), not with a bare cancellation

    async def acquire(self, kind: WatchKind, uri: str | None, identity: Identity) -> Handle | None:
        caller = asyncio.current_task()
        assert caller is not None
        self._callers.add(caller)
        try:
            async with asyncio.timeout(WAIT_S):
                return await super().acquire(kind, uri, identity)
        except TimeoutError:
            raise AssertionError(f"acquire({kind!r}, {uri!r}) not answered within {WAIT_S} s") from None
        except asyncio.CancelledError:
            if self.crashed is None:
                raise
            caller.uncancel()
            raise AssertionError(f"a look of the registry crashed: {self.crashed!r}") from self.crashed
        finally:
            self._callers.discard(caller)
