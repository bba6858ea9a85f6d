"""The logs of `mcp-sidecar run` as a real process: JSON lines naming the instance, the expected events, and
neither a credential nor any resource content, even at debug level."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from tests.kit import UPDATED, ListenStream, cli, rpc
from tests.peers import Upstream

TOKEN = "s3cr3t-token"
AUTHORIZATION = f"Bearer {TOKEN}"
API_KEY = "k3y-s3cr3t"
"""A secret of the configuration (a header sent upstream): the configuration line must mask it."""
PRICE = "catalog://price"
PROFILE = "catalog://profile"
CONTENTS = ("price=100", "price=120", "profile of")
"""Resource texts the session reads or causes; none may reach a log line."""


def _config(tmp_path: Path, upstream: Upstream) -> Path:
    path = tmp_path / "sidecar.yaml"
    path.write_text(
        f"upstream:\n  url: {upstream.url}\n  headers:\n    x-api-key: {API_KEY}\n"
        "listen:\n  port: 0\n"
        "polling:\n  min_interval_ms: 100\n  default_interval_ms: 300\n  linger_ms: 100\n"
        "logging:\n  level: debug\n  format: json\n",
        encoding="utf-8",
    )
    return path


async def test_logs_are_json_with_the_instance_and_never_show_tokens_or_contents(
    tmp_path: Path, fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    auth = {"Authorization": AUTHORIZATION}
    async with cli("run", "--config", str(_config(tmp_path, fast_upstream)), exit_timeout_s=15.0) as sidecar:
        listening = await sidecar.wait_for_record("stderr", "mcp-sidecar listening")
        url = listening["url"]
        assert listening["event_loop"] == "uvloop", "listen.event_loop: auto runs on uvloop on Linux"
        status, profile = await rpc(http, url, "resources/read", {"uri": PROFILE}, extra_headers=auth)
        assert status == 200 and profile["result"]["contents"][0]["text"] == f"profile of {TOKEN} v1"
        status, price = await rpc(http, url, "resources/read", {"uri": PRICE}, extra_headers=auth)
        assert status == 200 and price["result"]["contents"][0]["text"] == "price=100"

        leaving = ListenStream(http, url, "leaving", [PRICE], authorization=AUTHORIZATION)
        staying = ListenStream(http, url, "staying", [PRICE, PROFILE], authorization=AUTHORIZATION)
        try:
            for stream in (leaving, staying):
                await stream.open()
            await fast_upstream.set_price(120)
            await fast_upstream.bump_profile(TOKEN)  # the private profile changes too: v2
            updated = {(await staying.next())["params"]["uri"] for _ in range(2)}
            assert updated == {PRICE, PROFILE}
            assert (await leaving.next())["method"] == UPDATED
            await leaving.close()
            await sidecar.wait_for_record("stderr", "listen stream ended")
            code = await sidecar.stop()
            # Graceful shutdown: the stream still open gets the complete result before the process exits.
            final = await staying.next()
            assert final["id"] == "staying" and final["result"]["resultType"] == "complete"
        finally:
            await leaving.close()
            await staying.close()
        lines, stdout = sidecar.lines["stderr"], sidecar.lines["stdout"]

    everything = "\n".join(lines)
    assert code == 0, everything
    assert "Traceback" not in everything
    assert stdout == []
    for secret in (TOKEN, "Bearer", API_KEY, *CONTENTS):
        offending = [line for line in lines if secret in line]
        assert not offending, f"{secret!r} logged: {offending}"

    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    assert entries and all(isinstance(entry, dict) for entry in entries)
    instances = {entry.get("instance") for entry in entries}
    assert len(instances) == 1 and None not in instances, instances
    for entry in entries:
        assert {"ts", "level", "logger", "msg"} <= set(entry), entry

    def logged(msg: str) -> list[dict[str, Any]]:
        return [entry for entry in entries if entry["msg"] == msg]

    (configuration,) = logged("configuration")
    assert configuration["config"]["upstream"]["url"] == fast_upstream.url
    assert configuration["config"]["upstream"]["headers"] == {"x-api-key": "**********"}
    assert configuration["config"]["polling"]["default_interval_ms"] == 300
    (listening,) = logged("mcp-sidecar listening")
    assert listening["upstream"] == fast_upstream.url
    assert [entry["era"] for entry in logged("upstream era detected")] == ["2026-07-28"]
    assert sorted(entry["subscription_id"] for entry in logged("listen stream opened")) == ["leaving", "staying"]
    ended = {entry["subscription_id"]: entry["reason"] for entry in logged("listen stream ended")}
    assert ended == {"leaving": "client", "staying": "shutdown"}
    changes = logged("change detected")
    assert {entry["kind"] for entry in changes} == {"resource"} and len(changes) == 2
    for entry in changes:
        # Watches are named by a short hash: neither the URI nor the context shows.
        assert len(entry["watch"]) == 12 and entry["generation"] == 1
    assert logged("watch started") and logged("shutting down")
