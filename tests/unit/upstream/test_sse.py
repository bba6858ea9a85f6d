"""The SSE decoder follows the WHATWG rules, on the byte streams real resumable servers send."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.upstream.sse import SSEDecoder, SSEEvent, SSETooLarge, frame

MESSAGE = '{"jsonrpc":"2.0","id":1,"result":{}}'


def decode_all(stream: bytes, *, chunk_size: int | None = None, limit: int = 1 << 20) -> list[SSEEvent]:
    decoder = SSEDecoder(limit)
    if chunk_size is None:
        return decoder.feed(stream)
    events: list[SSEEvent] = []
    for start in range(0, len(stream), chunk_size):
        events.extend(decoder.feed(stream[start : start + chunk_size]))
    return events


@pytest.mark.parametrize("newline", [b"\n", b"\r", b"\r\n"], ids=["LF", "CR", "CR+LF"])
@pytest.mark.parametrize("chunk_size", [None, 1, 2, 7], ids=["whole", "byte", "pairs", "sevens"])
def test_a_priming_event_is_skipped_and_the_answer_decoded(newline: bytes, chunk_size: int | None) -> None:
    # What a resumable server sends: a priming event (an id, empty data), then the JSON-RPC answer.
    stream = newline.join(
        [b"id: 0a1b-priming", b"data: ", b"", b"event: message", b"id: 0a1b-1", b"data: " + MESSAGE.encode(), b"", b""]
    )
    assert decode_all(stream, chunk_size=chunk_size) == [SSEEvent(MESSAGE, "message", "0a1b-1")]


def test_events_without_data_and_comments_deliver_nothing() -> None:
    stream = b": keep-alive\n\nid: 7\n\nretry: 3000\n\nevent: ping\n\ndata\n\ndata:\ndata:\n\ndata: x\n\n"
    # `data` without a colon is a data line with an empty value; empty data carries no message either.
    assert decode_all(stream) == [SSEEvent("x", "message", "7", 3000)]


def test_multi_line_data_is_joined_with_line_feeds() -> None:
    assert decode_all(b'data: {\ndata:  "a": 1\ndata: }\n\n') == [SSEEvent('{\n "a": 1\n}')]


def test_only_one_space_after_the_colon_is_removed_and_unknown_fields_are_ignored() -> None:
    assert decode_all(b"foo: bar\ndata:  x\n\n") == [SSEEvent(" x")]


def test_an_id_holding_nul_is_ignored_and_retry_must_be_digits() -> None:
    assert decode_all(b"id: 1\n\nid: a\0b\nretry: 1x\ndata: d\n\n") == [SSEEvent("d", "message", "1")]


def test_a_byte_order_mark_at_the_start_is_dropped() -> None:
    assert decode_all("\ufeffdata: x\n\n".encode()) == [SSEEvent("x")]


def test_an_event_not_closed_by_a_blank_line_is_not_dispatched() -> None:
    assert decode_all(b"data: " + MESSAGE.encode() + b"\n") == []


def test_a_cr_at_a_chunk_end_and_a_lf_in_the_next_make_one_line_end() -> None:
    decoder = SSEDecoder(1024)
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n\r") == [SSEEvent("a")]
    assert decoder.feed(b"\ndata: b\n\n") == [SSEEvent("b")]


def test_an_event_larger_than_the_limit_is_refused() -> None:
    decoder = SSEDecoder(64)
    with pytest.raises(SSETooLarge):
        decoder.feed(b"data: " + b"x" * 100)
    decoder = SSEDecoder(64)
    with pytest.raises(SSETooLarge):
        for _ in range(20):
            decoder.feed(b"data: xxxxxxxx\n")


def test_frame_writes_type_and_data_only() -> None:
    event = SSEEvent("line one\nline two", "message", "id-9", 1000)
    assert frame(event) == b"event: message\r\ndata: line one\r\ndata: line two\r\n\r\n"
    assert decode_all(frame(event)) == [SSEEvent("line one\nline two")]


FIXTURES = sorted((Path(__file__).parent / "sse_fixtures").glob("*.sse"))


@pytest.mark.parametrize("fixture", FIXTURES, ids=[path.stem for path in FIXTURES])
@pytest.mark.parametrize("chunk_size", [None, 1, 5], ids=["whole", "byte", "fives"])
def test_bytes_real_resumable_servers_sent_decode_to_json_rpc_messages_only(
    fixture: Path, chunk_size: int | None
) -> None:
    # Captured from the npm reference server and FastMCP 1.x (see sse_fixtures/README.md): priming events,
    # ids, retry, keep-alive comments, LF and CRLF. Every event left must be one JSON-RPC message.
    raw = fixture.read_bytes()
    events = decode_all(raw, chunk_size=chunk_size)
    assert events, f"{fixture.name} holds no message"
    for event in events:
        message = json.loads(event.data)
        assert message["jsonrpc"] == "2.0" and ("method" in message or "id" in message)
    priming = raw.count(b"data: \n\n") + raw.count(b"data: \r\n\r\n") + raw.count(b"data: \r\nretry")
    data_lines = raw.count(b"\ndata: ") + raw.startswith(b"data: ")
    assert len(events) == data_lines - priming
