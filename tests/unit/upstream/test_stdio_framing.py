"""A child's pipes: lines cut at newlines and bounded, overlong answers still traced to their id, log limits,
and the minimal environment a child gets."""

from __future__ import annotations

import signal

import pytest

from sidecar.upstream.stdio.lines import LineSplitter, OverlongLine, TokenBucket
from sidecar.upstream.stdio.process import INHERITED_ENVIRONMENT, REACH_ENVIRONMENT, child_environment, exit_reason


def test_lines_are_cut_at_newlines_whatever_the_chunks() -> None:
    lines = LineSplitter(limit=64)
    assert lines.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    assert lines.feed(b":2}\r\n\n") == [b'{"b":2}\r', b""]
    assert lines.feed(b"partial") == []
    assert lines.feed(b" end\n") == [b"partial end"]


def test_a_line_over_the_limit_comes_out_overlong_without_being_held_whole() -> None:
    lines = LineSplitter(limit=1024)
    head = b'{"jsonrpc":"2.0","id":41,"result":{"text":"'
    out = lines.feed(head + b"x" * 5000)
    assert out == []
    out = lines.feed(b"y" * 5000 + b'"}}\n{"jsonrpc":"2.0","id":42,"result":{}}\n')
    assert len(out) == 2
    overlong, after = out
    assert isinstance(overlong, OverlongLine)
    assert overlong.size == len(head) + 10_003
    assert len(overlong.head) <= 256 and len(overlong.tail) <= 256
    assert overlong.find_id() == 41
    assert after == b'{"jsonrpc":"2.0","id":42,"result":{}}'


@pytest.mark.parametrize(
    ("head", "tail", "found"),
    [
        pytest.param(b'{"jsonrpc":"2.0","id":7,"result":{"t":"', b'xx"}}', 7, id="id-first (Python SDK)"),
        pytest.param(b'{"result":{"t":"xxx', b'xx"},"jsonrpc":"2.0","id":12}', 12, id="id-last (TypeScript SDK)"),
        pytest.param(b'{"result":{"t":"xxx', b'xx"}}', None, id="no-id"),
        pytest.param(b'{"result":{"t":"\\"id\\": 3', b'xx"},"id":"s-1"}', None, id="string-id-not-ours"),
    ],
)
def test_an_overlong_line_gives_up_its_integer_id(head: bytes, tail: bytes, found: int | None) -> None:
    assert OverlongLine(head, tail, 10_000).find_id() == found


def test_the_token_bucket_allows_a_burst_then_holds_back() -> None:
    bucket = TokenBucket(rate=2)
    allowed = sum(bucket.take() for _ in range(100))
    assert 20 <= allowed < 30  # ten seconds' worth, and what trickled in meanwhile
    assert not TokenBucket(rate=0).take()


def test_a_child_inherits_only_the_minimal_environment_plus_its_own() -> None:
    inherited = {"PATH": "/usr/bin", "HOME": "/home/s", "LANG": "C.UTF-8", "AWS_SECRET_ACCESS_KEY": "x", "TOKEN": "y"}
    env = child_environment({"API_KEY": "k", "LANG": "de_DE.UTF-8"}, inherited=inherited)
    assert env == {"PATH": "/usr/bin", "HOME": "/home/s", "LANG": "de_DE.UTF-8", "API_KEY": "k"}
    assert "PATH" in INHERITED_ENVIRONMENT and "HOME" in INHERITED_ENVIRONMENT


def test_a_child_inherits_the_proxy_and_ca_variables_and_the_names_asked_for() -> None:
    inherited = {
        "PATH": "/usr/bin",
        "HTTPS_PROXY": "http://proxy:3128",
        "no_proxy": "localhost",
        "SSL_CERT_FILE": "/etc/ca.pem",
        "UV_INDEX_URL": "https://pypi.internal/simple",
        "GITHUB_TOKEN": "t",
        "AWS_SECRET_ACCESS_KEY": "x",
    }
    env = child_environment({"SSL_CERT_FILE": "/srv/ca.pem"}, ["GITHUB_TOKEN", "NOT_SET"], inherited=inherited)
    assert env == {
        "PATH": "/usr/bin",
        "HTTPS_PROXY": "http://proxy:3128",
        "no_proxy": "localhost",
        "SSL_CERT_FILE": "/srv/ca.pem",  # upstream.env still has the last word
        "UV_INDEX_URL": "https://pypi.internal/simple",
        "GITHUB_TOKEN": "t",
    }
    assert {"HTTP_PROXY", "https_proxy", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"} <= set(REACH_ENVIRONMENT)


def test_exit_reasons_read_as_words() -> None:
    assert exit_reason(1) == "exited with code 1"
    assert exit_reason(-signal.SIGKILL) == "was killed by SIGKILL"
    assert exit_reason(None) == "is gone"
