"""Hostile and malformed input against `mcp-sidecar run` as a real process, in front of a real SDK upstream.

A property test posts random JSON values, random JSON-RPC envelopes, random header combinations and
random listen filters. Every answer is well-formed HTTP; every 4xx/5xx carries a JSON-RPC error; no
answer is a 500 or shows a traceback; a listen stream's first frame is an ack listing only what was
asked for; the process stays alive, logs no unexpected failure, and its memory stays bounded.

Also here, what test_bad_input.py and test_listen.py do not cover: a 413 sent while the body is still
on its way (the sidecar reads only the headers), and a subscribed URI over `streams.max_uri_length`.
"""

from __future__ import annotations

import http.client
import json
import socket
import string
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sidecar.protocol.constants import NAMED_METHODS
from sidecar.protocol.envelope import encode_header_value
from tests.kit import ACK, META, PV, SseParser, parse_sse
from tests.kit.sync_process import Process, spawn, wait_http
from tests.procs import free_port

BODY_LIMIT = 4096
MAX_URI_LENGTH = 256
MAX_URIS = 8
RSS_GROWTH_LIMIT = 48 * 1024 * 1024
"""What 200 requests may add to the process's resident memory (it is about 60 MiB to start with)."""
SHOP_URIS = ("catalog://price", "catalog://items/a1", "catalog://profile", "catalog://forbidden", "catalog://nope")


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    workdir = tmp_path_factory.mktemp("fuzz")
    upstream_port, port, admin_port = free_port(), free_port(), free_port()
    shop = [sys.executable, "-m", "tests.peers.shop_server", "--port", str(upstream_port), "--era", "modern"]
    with spawn(shop, workdir / "shop.log") as shop_proc:
        wait_http(f"http://127.0.0.1:{upstream_port}/admin/health", shop_proc, workdir / "shop.log")
        config = {
            "upstream": {"url": f"http://127.0.0.1:{upstream_port}/mcp", "timeout_s": 5},
            "listen": {"port": port, "max_body_bytes": BODY_LIMIT, "shutdown_grace_s": 2},
            "admin": {"port": admin_port},
            "streams": {"max_uri_length": MAX_URI_LENGTH, "max_uris_per_stream": MAX_URIS, "max_streams": 100},
            "polling": {"min_interval_ms": 100, "default_interval_ms": 300, "linger_ms": 100},
            "logging": {"format": "json", "level": "info"},
        }
        path = workdir / "sidecar.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        log = workdir / "sidecar.log"
        with spawn([sys.executable, "-m", "sidecar.cli", "run", "--config", str(path)], log) as proc:
            wait_http(f"http://127.0.0.1:{port}/readyz", proc, log)
            process = Process(proc, port, log, admin_port)
            _warm_up(process)
            process.baseline_rss = process.rss()
            yield process


# -- the property ---------------------------------------------------------------------------------------

METHODS = (
    "server/discover", "subscriptions/listen", "tools/list", "tools/call", "prompts/list", "prompts/get",
    "resources/list", "resources/read", "resources/templates/list", "completion/complete", "initialize",
    "ping", "logging/setLevel", "resources/subscribe", "notifications/initialized", "notifications/cancelled",
)  # fmt: skip
header_text = st.text(alphabet=string.ascii_letters + string.digits + " -_.:/=?*,;\"'{}[]!@#$%^&()+~", max_size=40)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
uris = st.sampled_from(SHOP_URIS) | st.text(max_size=30) | st.builds(lambda n: "x://" + "a" * n, st.integers(200, 400))
listen_filters = st.fixed_dictionaries(
    {},
    optional={
        "resourceSubscriptions": st.lists(uris, max_size=12) | json_values,
        "toolsListChanged": st.booleans() | json_values,
        "promptsListChanged": st.booleans(),
        "resourcesListChanged": st.booleans(),
    },
)
metas = (
    st.just(META)
    | json_values
    | st.fixed_dictionaries(
        {"io.modelcontextprotocol/protocolVersion": st.sampled_from([PV, "2025-11-25"]) | json_values},
        optional={"io.modelcontextprotocol/clientCapabilities": st.just({}) | json_values},
    )
)
param_objects = st.fixed_dictionaries(
    {},
    optional={
        "_meta": metas,
        "uri": uris,
        "name": st.sampled_from(["echo", "set_price", "pricing"]) | st.text(max_size=10),
        "arguments": json_values,
        "notifications": listen_filters | json_values,
    },
)
params = json_values | param_objects
envelopes = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.just("2.0") | json_values,
        "id": st.integers(-(2**63), 2**63) | st.text(max_size=10) | json_values,
        "method": st.sampled_from(METHODS) | st.text(max_size=30) | json_values,
        "params": params,
    },
)
header_sets = st.fixed_dictionaries(
    {},
    optional={
        "MCP-Protocol-Version": st.sampled_from([PV, "2025-11-25", "2099-01-01", ""]) | header_text,
        "Mcp-Method": st.sampled_from(METHODS) | header_text,
        "Mcp-Name": st.sampled_from((*SHOP_URIS, "echo")) | header_text,
        "Content-Type": st.sampled_from(["application/json", "text/plain", "application/json; charset=utf-8"]),
        "Accept": st.sampled_from(["application/json, text/event-stream", "text/event-stream", "*/*"]) | header_text,
        "Origin": st.sampled_from(["http://localhost:3000", "https://evil.example", "null"]) | header_text,
        "Host": st.sampled_from(["127.0.0.1", "localhost:1", "evil.example", "[::1]:8080"]) | header_text,
        "Authorization": st.sampled_from(["Bearer u1", "Bearer u2", "Basic x"]) | header_text,
        "Mcp-Session-Id": header_text,
        "Mcp-Param-Region": header_text,
    },
)


@st.composite
def cases(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """(body, headers): a random body under random headers, or a well-formed request of a random method
    (a listen most often) with random parameters, so cases get past the envelope checks too."""
    if draw(st.booleans()):
        body = draw(
            st.one_of(
                json_values.map(lambda value: json.dumps(value).encode()),
                envelopes.map(lambda value: json.dumps(value).encode()),
                st.binary(max_size=200),
            )
        )
        return body, draw(header_sets)
    method = draw(st.sampled_from(METHODS) | st.just("subscriptions/listen"))
    body_params: dict[str, Any] = {**draw(param_objects), "_meta": META}
    if method == "subscriptions/listen":
        body_params["notifications"] = draw(listen_filters)
    request_id = draw(st.integers(0, 10**6) | st.text(min_size=1, max_size=8))
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": body_params}).encode()
    chosen = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
              "MCP-Protocol-Version": PV, "Mcp-Method": method}  # fmt: skip
    named = NAMED_METHODS.get(method)
    if named is not None and isinstance(body_params.get(named), str):
        chosen["Mcp-Name"] = encode_header_value(body_params[named])
    if draw(st.integers(0, 3)) == 0:
        chosen.update(draw(header_sets))
    return body, chosen


def _post(port: int, body: bytes, hdrs: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """POST and read the answer; a stream is read up to its first event, then dropped."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.putrequest("POST", "/mcp", skip_host="Host" in hdrs, skip_accept_encoding=True)
        for name, value in hdrs.items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        got = {name.lower(): value for name, value in resp.getheaders()}
        if got.get("content-type", "").startswith("text/event-stream"):
            lines, parser = [], SseParser()
            while line := resp.readline(1 << 20):  # up to the end of the first event (a listen stream goes on)
                lines.append(line)
                if isinstance(parser.feed(line.decode().rstrip("\r\n")), dict):
                    break
            return resp.status, got, b"".join(lines)
        return resp.status, got, resp.read()
    finally:
        conn.close()


def _sse_data(raw: bytes) -> dict[str, Any]:
    (message,) = parse_sse(raw)
    return message


def _check_answer(body: bytes, hdrs: dict[str, str], status: int, got: dict[str, str], raw: bytes) -> None:
    assert 200 <= status < 600
    assert status != 500, raw  # a 500 is the sidecar failing; everything else here has a proper answer
    assert b"Traceback" not in raw
    if status == 202:
        assert raw == b""
        return
    if got.get("content-type", "").startswith("text/event-stream"):
        first = _sse_data(raw)
        if first.get("method") == ACK:
            _check_ack(body, first)
        else:  # a forwarded request answered as a stream: a JSON-RPC message
            assert first.get("jsonrpc") == "2.0", first
        return
    message = json.loads(raw)
    assert isinstance(message, dict) and message.get("jsonrpc") == "2.0", raw
    if status >= 400:
        assert isinstance(message.get("error"), dict), raw  # an error status always carries a JSON-RPC error
    if "error" in message:
        assert isinstance(message["error"].get("code"), int) and isinstance(message["error"].get("message"), str)
    else:
        assert isinstance(message.get("result"), dict), raw


def _check_ack(body: bytes, ack: dict[str, Any]) -> None:
    """The ack lists only what the listen asked for (invariant 2), within the per-stream URI limit."""
    asked = json.loads(body)["params"]["notifications"]
    honoured = ack["params"]["notifications"]
    for flag in ("toolsListChanged", "promptsListChanged", "resourcesListChanged"):
        if flag in honoured:
            assert honoured[flag] is True and asked.get(flag) is True, (asked, honoured)
    accepted = honoured.get("resourceSubscriptions", [])
    assert len(accepted) <= MAX_URIS and len(set(accepted)) == len(accepted)
    assert set(accepted) <= set(asked.get("resourceSubscriptions", [])) & set(SHOP_URIS), (asked, honoured)
    assert "catalog://nope" not in accepted and "catalog://forbidden" not in accepted


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(case=cases())
def test_random_input_gets_a_well_formed_answer_and_the_process_stays_up(
    case: tuple[bytes, dict[str, str]], sidecar: Process
) -> None:
    body, hdrs = case
    status, got, raw = _post(sidecar.port, body, hdrs)
    stream = got.get("content-type", "").startswith("text/event-stream")
    event(f"HTTP {status}{' stream' if stream else ''}")  # the spread of outcomes: --hypothesis-show-statistics
    _check_answer(body, hdrs, status, got, raw)
    assert sidecar.alive


def _warm_up(process: Process) -> None:
    """Ordinary requests and streams, so the memory baseline includes what any running sidecar holds."""
    hdrs = {"Content-Type": "application/json", "MCP-Protocol-Version": PV}
    for n in range(50):
        method = ("tools/list", "subscriptions/listen", "resources/read")[n % 3]
        params: dict[str, Any] = {"_meta": META}
        if method == "subscriptions/listen":
            params["notifications"] = {"resourceSubscriptions": ["catalog://price"], "toolsListChanged": True}
        elif method == "resources/read":
            params["uri"] = f"catalog://items/w{n}"
        headers_n = {**hdrs, "Mcp-Method": method, **({"Mcp-Name": params["uri"]} if "uri" in params else {})}
        status, _, raw = _post(
            process.port,
            json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}).encode(),
            headers_n,
        )
        assert status == 200, raw


def test_after_the_random_input_the_process_is_healthy_bounded_and_logged_no_failure(sidecar: Process) -> None:
    # Runs after the property, in the same process.
    assert sidecar.alive
    growth = sidecar.rss() - sidecar.baseline_rss
    print(f"\nRSS {sidecar.baseline_rss / 2**20:.1f} MiB after warm-up, +{growth / 2**20:.1f} MiB after the fuzzing")
    assert growth < RSS_GROWTH_LIMIT
    deadline = time.monotonic() + 15
    while sidecar.metric("mcp_sidecar_listen_streams") != 0:  # every fuzzed stream was dropped by its client
        assert time.monotonic() < deadline, "listen streams still open"
        time.sleep(0.05)  # polling a gauge of another process, bounded
    with urllib.request.urlopen(f"http://127.0.0.1:{sidecar.port}/healthz", timeout=5) as resp:
        assert resp.status == 200
    failures = [
        entry for entry in sidecar.log_entries() if entry.get("level") in ("error", "critical", "raw") or "exc" in entry
    ]
    assert failures == []


# -- limits the envelope tests do not cover --------------------------------------------------------------


def test_a_body_announced_over_the_limit_gets_413_before_it_is_sent_whole(sidecar: Process) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": {"_meta": META}}).encode()
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{sidecar.port}\r\nContent-Type: application/json\r\n"
        f"MCP-Protocol-Version: {PV}\r\nMcp-Method: tools/list\r\nContent-Length: {100 * 1024 * 1024}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", sidecar.port), timeout=10) as sock:
        sock.sendall(head + body)  # 100 MiB announced, a few dozen bytes sent; the rest never comes
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 413"), answer
    message = json.loads(rest.partition(b"\r\n\r\n")[2])
    assert message["error"]["code"] == -32600 and str(BODY_LIMIT) in message["error"]["message"]
    assert sidecar.alive


def test_a_subscribed_uri_longer_than_the_limit_is_invalid_params(sidecar: Process) -> None:
    long_uri = "catalog://items/" + "a" * MAX_URI_LENGTH
    filters = {"resourceSubscriptions": ["catalog://price", long_uri]}
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": "long",
            "method": "subscriptions/listen",
            "params": {"notifications": filters, "_meta": META},
        }
    ).encode()
    hdrs = {"Content-Type": "application/json", "MCP-Protocol-Version": PV, "Mcp-Method": "subscriptions/listen"}
    status, _, raw = _post(sidecar.port, body, hdrs)
    assert status == 400, raw
    message = json.loads(raw)
    assert message["id"] == "long" and message["error"]["code"] == -32602
    assert str(MAX_URI_LENGTH) in message["error"]["message"]


# -- the regression corpus: every input that ever broke the sidecar, replayed on every run -------------------

REGRESSIONS = [
    # A Host the URL parser cannot split (an unclosed IPv6 bracket) got a 500 and a logged traceback.
    pytest.param({"Host": "["}, id="host-unclosed-bracket"),
    # The same for an Origin: the DNS-rebinding guard parsed it and raised.
    pytest.param({"Origin": "http://["}, id="origin-unclosed-bracket"),
]


@pytest.mark.parametrize("bad_headers", REGRESSIONS)
def test_an_input_that_once_broke_the_sidecar_gets_a_400_json_rpc_error(
    bad_headers: dict[str, str], sidecar: Process
) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {"_meta": META}}).encode()
    hdrs = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": PV, "Mcp-Method": "tools/list", **bad_headers}  # fmt: skip
    status, _, raw = _post(sidecar.port, body, hdrs)
    assert b"Traceback" not in raw
    assert status == 400, raw
    message = json.loads(raw)
    assert message.get("jsonrpc") == "2.0" and isinstance(message.get("error", {}).get("code"), int), raw
    assert sidecar.alive
