"""The REST server's HTTP plumbing: a bare ASGI app in front of
`PredictionService.handle`, and uvicorn's HTTP/1.1 protocols answering what they cannot
parse in the API's JSON.

One request at one client is mostly overhead around a small model's call, so the path
is kept short: uvicorn with httptools' parser on uvloop when they are installed (h11
on asyncio otherwise), no web framework between uvicorn and the routes (the service
routes by itself), and JSON through orjson when it is installed (predict.instances,
`dumps` here) with the standard library's answers wherever orjson would differ.
"""
from __future__ import annotations

import json
import re
import socket
from typing import Any, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from predict.errors import UsageError

try:
    import orjson
except ImportError:  # pragma: no cover - an install without it
    orjson = None  # type: ignore[assignment]

try:
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - an install without it
    httptools = None  # type: ignore[assignment]

try:
    import uvloop  # noqa: F401 - uvicorn imports it by name
    LOOP = "uvloop"
except ImportError:  # pragma: no cover - an install without it
    LOOP = "asyncio"

METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")
JSON_TYPE = b"application/json"
# a request line as RFC 9112 has it, with a method of capitals: what a 405 may name
REQUEST_LINE = re.compile(rb"([A-Z]{1,20}) [!-~]+ HTTP/[0-9]\.[0-9]\r?\n")
MALFORMED = ("malformed HTTP request (request line, headers or chunked body); send "
             "valid HTTP/1.1")


class ClientDisconnect(Exception):
    """The client went away before sending its whole body."""


def dumps(payload) -> bytes:
    """json.dumps's answer, through orjson when it gives the same: orjson writes NaN and
    infinities as null (the standard library and TF Serving write NaN, Infinity) and
    refuses integers beyond 64 bits; answers holding either go through json."""
    if orjson is not None:
        try:
            raw = orjson.dumps(payload)
        except TypeError:
            pass
        else:
            if b"null" not in raw:  # a NaN, or a string holding null: json decides
                return raw
    return json.dumps(payload).encode()


class Request:
    """What the routes read of a request: method, path, a header, the body's chunks."""

    __slots__ = ("method", "path", "_headers", "_receive")

    def __init__(self, scope: dict, receive):
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self._headers = scope["headers"]
        self._receive = receive

    def header(self, name: bytes, default: str = "") -> str:
        for key, value in self._headers:  # uvicorn lowercases the names
            if key == name:
                return value.decode("latin-1")
        return default

    async def stream(self):
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect
            body = message.get("body", b"")
            if body:
                yield body
            if not message.get("more_body", False):
                return


def app(handle):
    """The ASGI app: `await handle(request)` -> (status, body, headers, content type);
    a method outside METHODS is 405 in the API's format, as before."""
    allow = ", ".join(METHODS)

    async def asgi(scope, receive, send):
        if scope["type"] != "http":  # lifespan is off; nothing else is served
            return
        request = Request(scope, receive)
        if request.method in METHODS:
            status, body, headers, media_type = await handle(request)
        else:
            status, media_type, headers = 405, JSON_TYPE, {"Allow": allow}
            body = dumps({"error": f"{request.method} is not allowed; use GET or POST"})
        raw_headers = [(b"content-type", media_type),
                       (b"content-length", str(len(body)).encode())]
        for name, value in headers.items():
            raw_headers.append((name.lower().encode("latin-1"), value.encode("latin-1")))
        await send({"type": "http.response.start", "status": status,
                    "headers": raw_headers})
        await send({"type": "http.response.body", "body": body})
    return asgi


def _error_response(status: int, reason: bytes, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    return b"".join([b"HTTP/1.1 %d %s\r\n" % (status, reason),
                     b"content-type: application/json\r\n",
                     b"content-length: %d\r\n" % len(body), b"connection: close\r\n",
                     b"\r\n", body])


class JSONErrorsH11(H11Protocol):
    """uvicorn's h11 protocol, answering a request it cannot parse (a malformed request
    line, a negative Content-Length, bad chunking) with the API's JSON error body
    instead of plain text; the connection is closed after, as before."""

    def send_400_response(self, msg: str) -> None:
        body = json.dumps({"error": MALFORMED}).encode()
        headers = [(b"content-type", JSON_TYPE),
                   (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()


class OneWrite:
    """A transport for one request's answer that holds the answer's head (status line
    and headers) until its body is written, then writes both at once.

    uvicorn writes the head and the body of an answer separately: two sends, two TCP
    segments, and a client woken twice (some 30 us of a 0.5 ms request at one client).
    Whatever comes after the head (the body, even empty; a close) sends the held head
    first, so nothing is reordered or lost; `100 Continue` is never held."""

    __slots__ = ("_transport", "_held")

    def __init__(self, transport):
        self._transport = transport
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif data.startswith(b"HTTP/1.1 ") and not data.startswith(b"HTTP/1.1 100 ") and \
                data.endswith(b"\r\n\r\n"):
            self._held = data
        else:
            self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def _flush(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held)

    def __getattr__(self, name):
        return getattr(self._transport, name)


if httptools is not None:
    class _Parser:
        """httptools' parser, remembering whether it refused the request's method
        (llhttp knows the registered methods only: FOO is a parse error there, a 405
        for h11 and for the routes)."""

        __slots__ = ("_parser", "refused_method")

        def __init__(self, parser):
            self._parser = parser
            self.refused_method: bytes | None = None

        def feed_data(self, data: bytes) -> None:
            try:
                self._parser.feed_data(data)
            except httptools.HttpParserInvalidMethodError:
                # 405 only for a well-formed request line whose method no route takes;
                # bytes that are no request line at all (a TLS hello, `FOO` alone) are
                # malformed HTTP: 400, as the docs say
                line = REQUEST_LINE.match(data)
                self.refused_method = line[1] if line else None
                raise

        def __getattr__(self, name):
            return getattr(self._parser, name)

    class JSONErrorsHttpTools(HttpToolsProtocol):
        """uvicorn's httptools protocol with the same JSON answers as JSONErrorsH11,
        and 405 (not 400) for a method llhttp does not know; each answer's head and
        body go out in one write (OneWrite)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._methods = _Parser(self.parser)
            self.parser = cast(Any, self._methods)

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            cycle = self.cycle
            # a HEAD answer has no body write to carry its head: it goes out alone
            if cycle is not None and self.transport is not None and \
                    cycle.scope.get("method") != "HEAD":
                cycle.transport = cast(Any, OneWrite(self.transport))

        def send_400_response(self, msg: str) -> None:
            method = self._methods.refused_method
            if method is not None:
                answer = _error_response(405, b"Method Not Allowed",
                                         f"{method.decode()} is not allowed; use GET or "
                                         "POST")
            else:
                answer = _error_response(400, b"Bad Request", MALFORMED)
            self.transport.write(answer)
            self.transport.close()

    PROTOCOL: type = JSONErrorsHttpTools
else:  # pragma: no cover - an install without httptools
    PROTOCOL = JSONErrorsH11


def bind(host: str, port: int) -> socket.socket:
    """The REST port's listening socket (UsageError when it cannot be had)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio turns Nagle off (TCP_NODELAY) only on sockets
    # whose proto says TCP; with proto 0 every keep-alive response waits ~40 ms for the
    # client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port} ({exc.strerror}); pick another "
                         "--rest_api_port or --host") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


__all__ = ["app", "dumps", "Request", "ClientDisconnect", "JSONErrorsH11", "OneWrite",
           "PROTOCOL", "LOOP", "METHODS", "bind"]
