"""Era detection follows the envelope, never the method name (protocol.md §6.3)."""

from __future__ import annotations

import orjson
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from sidecar.protocol.envelope import (
    MAX_DEPTH,
    Message,
    decode_header_value,
    detect_era,
    encode_header_value,
    parse_message,
    validate_modern,
)
from sidecar.protocol.errors import (
    HeaderMismatch,
    InvalidParams,
    InvalidRequest,
    ParseError,
    RpcError,
    UnsupportedVersion,
)

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


def _headers(**values: str) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict({k.replace("_", "-"): v for k, v in values.items()}))


@pytest.mark.parametrize(
    ("params", "headers", "era"),
    [
        ({"_meta": META}, {}, "modern"),
        ({}, {"MCP_Protocol_Version": "2026-07-28"}, "modern"),
        ({}, {}, "legacy"),
        ({}, {"MCP_Protocol_Version": "2025-11-25"}, "legacy"),
        ({"_meta": META}, {"Mcp_Session_Id": "abc"}, "legacy"),
    ],
    ids=["modern-meta", "modern-header", "bare", "legacy-header", "session"],
)
def test_era_comes_from_the_envelope(params: dict[str, object], headers: dict[str, str], era: str) -> None:
    message = parse_message(b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":%s}' % _json(params))
    assert detect_era(message, _headers(**headers)) == era


def _json(value: object) -> bytes:
    return orjson.dumps(value)


def test_base64_header_values_decode_and_bad_ones_do_not_match() -> None:
    assert decode_header_value("=?base64?w6k=?=") == "é"
    assert decode_header_value("plain") == "plain"
    assert decode_header_value("=?base64?***?=") is None


def _refusal(body: bytes) -> RpcError:
    with pytest.raises(RpcError) as refused:
        parse_message(body)
    return refused.value


def test_a_request_parses_into_its_method_id_and_params() -> None:
    message = parse_message(b'{"jsonrpc":"2.0","id":"a","method":"tools/list","params":{"cursor":"c"}}')
    assert (message.method, message.id, message.params) == ("tools/list", "a", {"cursor": "c"})
    assert message.raw == {"jsonrpc": "2.0", "id": "a", "method": "tools/list", "params": {"cursor": "c"}}
    assert not message.is_notification and message.meta is None
    bare = parse_message(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    assert bare.is_notification and bare.id is None and bare.params == {}
    assert parse_message(b'{"jsonrpc":"2.0","id":0,"method":"m","params":{"_meta":{"k":1}}}').meta == {"k": 1}
    assert parse_message(b'{"jsonrpc":"2.0","id":0,"method":"m","params":{"_meta":[1]}}').meta is None


IR = "Invalid Request: "


@pytest.mark.parametrize(
    ("body", "kind", "message", "echoed"),
    [
        (b"{nope", ParseError, "Parse error: the body is not valid JSON", None),
        (b"[]", InvalidRequest, IR + "the body must be one JSON-RPC object (batches are not supported)", None),
        (b'{"jsonrpc":"2.0","id":true,"method":"m"}', InvalidRequest, IR + "id must be a string or an integer", None),
        (b'{"jsonrpc":"2.0","id":1.5,"method":"m"}', InvalidRequest, IR + "id must be a string or an integer", None),
        (b'{"jsonrpc":"2.0","id":null,"method":"m"}', InvalidRequest, IR + "id must be a string or an integer", None),
        (b'{"jsonrpc":"1.0","id":7,"method":"m"}', InvalidRequest, IR + 'jsonrpc must be "2.0"', 7),
        (b'{"id":"s","method":"m"}', InvalidRequest, IR + 'jsonrpc must be "2.0"', "s"),
        (b'{"jsonrpc":"2.0","id":2,"result":{}}', InvalidRequest, IR + "responses are not accepted here", 2),
        (b'{"jsonrpc":"2.0","id":2,"error":{}}', InvalidRequest, IR + "responses are not accepted here", 2),
        (b'{"jsonrpc":"2.0","id":3,"method":""}', InvalidRequest, IR + "method must be a non-empty string", 3),
        (b'{"jsonrpc":"2.0","id":3,"method":5}', InvalidRequest, IR + "method must be a non-empty string", 3),
        (b'{"jsonrpc":"2.0","id":4,"method":"m","params":[1]}', InvalidRequest, IR + "params must be an object", 4),
    ],
    ids=["json", "batch", "bool-id", "float-id", "null-id", "version", "no-version", "result", "error",
         "empty-method", "number-method", "list-params"],
)  # fmt: skip
def test_a_malformed_body_is_refused_with_its_error_and_the_id_echoed_when_usable(
    body: bytes, kind: type[RpcError], message: str, echoed: object
) -> None:
    refusal = _refusal(body)
    assert type(refusal) is kind
    assert refusal.message == message
    assert refusal.request_id == echoed


def _nested(lists: int) -> bytes:
    """A request whose params are an object holding `lists` lists one in another: `lists + 1` levels deep."""
    return b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":' + b"[" * lists + b"]" * lists + b"}}"


def test_params_nested_deeper_than_the_limit_are_refused_and_the_limit_itself_is_not() -> None:
    assert MAX_DEPTH == 128
    assert parse_message(_nested(MAX_DEPTH - 1)).params["a"] is not None
    refusal = _refusal(_nested(MAX_DEPTH))
    assert refusal.message == "Invalid Request: params nested deeper than 128 levels"
    assert refusal.request_id == 1
    deep_in_objects = b'{"jsonrpc":"2.0","id":1,"method":"m","params":' + b'{"a":' * 129 + b"1" + b"}" * 130
    assert _refusal(deep_in_objects).message == "Invalid Request: params nested deeper than 128 levels"


def test_many_brackets_side_by_side_are_not_depth() -> None:
    wide = b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":[' + b",".join([b"{}"] * 300) + b"]}}"
    assert len(parse_message(wide).params["a"]) == 300
    wide_lists = b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":[' + b",".join([b"[]"] * 300) + b"]}}"
    assert len(parse_message(wide_lists).params["a"]) == 300


def test_meta_without_a_version_or_not_an_object_leaves_the_era_to_the_headers() -> None:
    no_version = parse_message(b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"x":1}}}')
    assert detect_era(no_version, _headers()) == "legacy"
    assert detect_era(no_version, _headers(MCP_Protocol_Version="2099-01-01")) == "modern"
    for version in ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"):
        assert detect_era(no_version, _headers(MCP_Protocol_Version=version)) == "legacy"


MODERN = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "add"}


def _modern(
    params: dict[str, object] | None = None, method: str = "tools/call", **headers: str
) -> tuple[Message, CIMultiDictProxy[str]]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"name": "add", "_meta": META, **(params or {})}}
    return parse_message(_json(body)), CIMultiDictProxy(CIMultiDict({**MODERN, **headers}))


def _mismatch(message: Message, headers: CIMultiDictProxy[str]) -> RpcError:
    with pytest.raises(RpcError) as refused:
        validate_modern(message, headers)
    return refused.value


def test_a_well_formed_modern_request_passes() -> None:
    validate_modern(*_modern())
    list_request, headers = _modern(method="tools/list", **{"Mcp-Method": "tools/list"})
    validate_modern(list_request, CIMultiDictProxy(CIMultiDict((k, v) for k, v in headers.items() if k != "Mcp-Name")))
    encoded, headers = _modern({"name": "é"}, **{"Mcp-Name": "=?base64?w6k=?="})
    validate_modern(encoded, headers)


@pytest.mark.parametrize("name", ["MCP-Protocol-Version", "Mcp-Method", "Mcp-Name"])
def test_a_modern_header_given_twice_is_refused(name: str) -> None:
    message, headers = _modern()
    doubled = CIMultiDict(headers)
    doubled.add(name, headers[name])
    refusal = _mismatch(message, CIMultiDictProxy(doubled))
    assert (type(refusal), refusal.message) == (HeaderMismatch, f"{name} header appears more than once")


def test_each_modern_header_that_is_missing_is_named() -> None:
    for name, also in (("MCP-Protocol-Version", ""), ("Mcp-Method", ""), ("Mcp-Name", ", required for tools/call")):
        message, headers = _modern()
        left = CIMultiDictProxy(CIMultiDict((k, v) for k, v in headers.items() if k != name))
        refusal = _mismatch(message, left)
        assert (type(refusal), refusal.message) == (HeaderMismatch, f"missing {name} header{also}")


@pytest.mark.parametrize(
    "meta",
    [
        None,
        {"io.modelcontextprotocol/clientCapabilities": {}},
        {"io.modelcontextprotocol/protocolVersion": 20260728, "io.modelcontextprotocol/clientCapabilities": {}},
        {"io.modelcontextprotocol/protocolVersion": "2026-07-28"},
        {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": []},
    ],
    ids=["none", "no-version", "number-version", "no-capabilities", "list-capabilities"],
)
def test_a_modern_request_without_a_proper_meta_envelope_is_invalid_params(meta: object) -> None:
    message, headers = _modern({"_meta": meta} if meta is not None else {})
    if meta is None:
        message = parse_message(_json({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "add"}}))
    refusal = _mismatch(message, headers)
    assert type(refusal) is InvalidParams
    assert refusal.message == (
        "params._meta must be an object carrying io.modelcontextprotocol/protocolVersion (string) "
        "and io.modelcontextprotocol/clientCapabilities (object)"
    )


def test_a_version_header_that_disagrees_with_meta_or_is_unsupported_is_refused() -> None:
    refusal = _mismatch(*_modern(**{"MCP-Protocol-Version": "2026-01-01"}))
    assert (type(refusal), refusal.message) == (
        HeaderMismatch,
        "MCP-Protocol-Version header '2026-01-01' does not match _meta protocolVersion '2026-07-28'",
    )
    future = {**META, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}
    refusal = _mismatch(*_modern({"_meta": future}, **{"MCP-Protocol-Version": "2099-01-01"}))
    assert (type(refusal), refusal.message) == (UnsupportedVersion, "Unsupported protocol version")
    assert refusal.data == {"supported": ["2026-07-28"], "requested": "2099-01-01"}


def test_method_and_name_headers_must_mirror_the_body() -> None:
    refusal = _mismatch(*_modern(**{"Mcp-Method": "tools/list"}))
    assert (type(refusal), refusal.message) == (
        HeaderMismatch,
        "Mcp-Method header does not match the request body's method",
    )
    for params, name in (({"name": "sub"}, "add"), ({"name": 5}, "5"), ({"name": "é"}, "=?base64?***?=")):
        refusal = _mismatch(*_modern(params, **{"Mcp-Name": name}))
        assert (type(refusal), refusal.message) == (HeaderMismatch, "Mcp-Name header does not match params.name")
    read, headers = _modern({"uri": "x://1"}, method="resources/read", **{"Mcp-Method": "resources/read"})
    validate_modern(read, CIMultiDictProxy(CIMultiDict({**headers, "Mcp-Name": "x://1"})))
    assert _mismatch(read, headers).message == "Mcp-Name header does not match params.uri"


def test_only_a_whole_well_formed_base64_form_is_decoded() -> None:
    assert decode_header_value("=?base64?w6k=") == "=?base64?w6k="
    assert decode_header_value("w6k=?=") == "w6k=?="
    assert decode_header_value("=?base64?w6k*=?=") is None, "a character outside base64 is malformed, not skipped"
    assert decode_header_value("=?base64?/w==?=") is None, "bytes that are not UTF-8"
    assert decode_header_value("=?base64??=") == ""


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        ("add", "add"),
        ("x://a b", "x://a b"),
        ("é", "=?base64?w6k=?="),
        ("a\tb", "=?base64?YQli?="),
        (" lead", "=?base64?IGxlYWQ=?="),
        ("trail ", "=?base64?dHJhaWwg?="),
        ("=?base64?x", "=?base64?PT9iYXNlNjQ/eA==?="),
    ],
    ids=["plain", "space", "non-ascii", "control", "leading-space", "trailing-space", "looks-encoded"],
)
def test_a_header_value_goes_plain_when_it_can_and_round_trips_either_way(value: str, encoded: str) -> None:
    assert encode_header_value(value) == encoded
    assert decode_header_value(encoded) == value
