"""The REST server's HTTP plumbing: a bare ASGI app in front of
`PredictionService.handle`, served by uvicorn as it comes (its own choice of parser
and event loop: httptools and uvloop when installed, h11 and asyncio otherwise).

No web framework sits between uvicorn and the routes (the service routes by itself),
and JSON goes through orjson when it is installed (predict.runtime.instances, `dumps` here)
with the standard library's answers wherever orjson would differ. A request uvicorn
cannot parse (a malformed request line, bad chunking) is answered by uvicorn itself:
400, plain text, the connection closed.
"""
from __future__ import annotations

import json
import socket

from predict.errors import UsageError

try:
    import orjson
except ImportError:  # pragma: no cover - an install without it
    orjson = None  # type: ignore[assignment]

METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")
JSON_TYPE = b"application/json"


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


__all__ = ["app", "dumps", "Request", "ClientDisconnect", "METHODS", "bind"]
