"""Just enough HTTP/1.1 for the fault-injecting upstream, written by hand so a fault can stop at any byte: a
request read off the socket (Content-Length or chunked), an answer's head and body, JSON-RPC answers."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

__all__ = ["Closed", "RawRequest", "error_message", "read_request", "response_head", "result_message", "write_response"]


@dataclass
class RawRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Closed(Exception):
    """The fault ended the connection on purpose."""


async def read_request(reader: asyncio.StreamReader) -> RawRequest | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    line, *lines = head.decode("latin-1").split("\r\n")
    method, path, _ = line.split(" ", 2)
    headers: dict[str, str] = {}
    for header in lines:
        if header:
            name, _, value = header.partition(":")
            headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    else:
        length = int(headers.get("content-length", "0"))
        body = await reader.readexactly(length) if length else b""
    return RawRequest(method, path, headers, body)


_REASONS = {200: "OK", 202: "Accepted", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
_REASONS.update({500: "Internal Server Error", 502: "Bad Gateway"})


def response_head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def write_response(writer: asyncio.StreamWriter, status: int, headers: dict[str, str], body: bytes) -> None:
    writer.write(response_head(status, {**headers, "Content-Length": str(len(body))}) + body)
    with contextlib.suppress(ConnectionError):
        await writer.drain()


def result_message(request_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def error_message(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
