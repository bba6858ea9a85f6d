"""One listen's trip through the code, counted: the sidecar's functions and modules that run from a listen request
to the notification frame of the first change, on the memory bus (`python -m bench.trip`).

A profile hook notes every function of `sidecar/` that is entered while one client opens a listen on one resource
of a 2025-11-25 shop server, reads its ack, and waits for the frame that tells the change the test then makes.
Each function counts once (constructors and helpers included). It is a structural figure, not a timing: it
says how much code a reader follows for the one thing the product does, and it moves only when the code does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp

from tests.kit import headers, request, serve_sidecar, sse_messages
from tests.peers import start_upstream

_SIDECAR = str(Path(__file__).resolve().parent.parent / "sidecar")
_POLLING = {"min_interval_ms": 100, "default_interval_ms": 300, "linger_ms": 100}


class _Trip:
    def __init__(self) -> None:
        self.functions: set[tuple[str, str]] = set()
        self.on = False

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and self.on:
            code = frame.f_code
            if code.co_filename.startswith(_SIDECAR):
                module = code.co_filename[len(_SIDECAR) - len("sidecar") :].removesuffix(".py")
                self.functions.add((module, code.co_qualname))


async def _walk(trip: _Trip) -> None:
    upstream = await start_upstream("legacy", read_ttl_ms=300)
    try:
        async with serve_sidecar(upstream.url, polling=_POLLING) as sidecar, aiohttp.ClientSession() as http:
            body = request("subscriptions/listen", {"notifications": {"resourceSubscriptions": ["catalog://price"]}})
            trip.on = True
            async with http.post(sidecar.url, json=body, headers=headers("subscriptions/listen")) as resp:
                frames = sse_messages(resp)
                ack = await anext(frames)
                assert ack["params"]["notifications"]["resourceSubscriptions"] == ["catalog://price"], ack
                trip.on = False
                await upstream.set_price(120)
                trip.on = True
                async with asyncio.timeout(15):
                    update = await anext(frames)
                trip.on = False
                assert update["method"] == "notifications/resources/updated", update
    finally:
        await upstream.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every function, by module")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    parser.add_argument("--packages", action="store_true", help="count by package (sidecar/watch, ...), not module")
    args = parser.parse_args()
    trip = _Trip()
    sys.setprofile(trip.hook)
    try:
        asyncio.run(_walk(trip))
    finally:
        sys.setprofile(None)
    modules = Counter(module for module, _ in trip.functions)
    packages = Counter(_package(module) for module, _ in trip.functions)
    if args.json:
        print(json.dumps({"functions": len(trip.functions), "modules": len(modules)}))
        return
    if args.list:
        for module, qualname in sorted(trip.functions):
            print(f"{module}:{qualname}")
    print(f"{len(trip.functions)} functions in {len(modules)} modules")
    for name, count in (packages if args.packages else modules).most_common():
        print(f"  {count:3d}  {name}")


def _package(module: str) -> str:
    """`sidecar/watch/engine/core` -> `sidecar/watch`: the package under `sidecar/` (or the top-level module)."""
    return "/".join(module.split("/")[:2])


if __name__ == "__main__":
    main()
