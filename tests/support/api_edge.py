"""A recording HTTP endpoint on 127.0.0.1, standing in for a cluster engine's API server.

A Kubernetes API server or Vertex AI cannot run here, so the engines' official clients
(kubernetes, google-cloud-aiplatform over REST) are pointed at this endpoint instead: the
clients build and send their real requests over real HTTP, the test reads back exactly
what was sent (method, path, query, JSON body) and the endpoint answers with the JSON the
real API documents. Nothing of ours is faked; only the far side of the network is.

    with ApiEdge() as api:
        api.route("POST", r"/apis/kubeflow.org/v1/namespaces/(\\w+)/tfjobs", 201, body)
        ... run the client against api.url ...
        request = api.requests[0]
"""
from __future__ import annotations

import dataclasses
import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


@dataclasses.dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclasses.dataclass
class Route:
    method: str
    pattern: re.Pattern
    status: int
    body: Any                      # JSON-able, bytes/str sent as text, or a callable
    content_type: str = "application/json"


class ApiEdge:
    """A threaded HTTP server on 127.0.0.1 with canned answers per (method, path regex).
    Unmatched requests get 404 with a Kubernetes-style Status body. Stopped on exit."""

    def __init__(self):
        self.routes: list[Route] = []
        self.requests: list[Request] = []
        edge = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self):
                url = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                request = Request(self.command, url.path, urllib.parse.parse_qs(url.query),
                                  {k.lower(): v for k, v in self.headers.items()},
                                  self.rfile.read(length) if length else b"")
                edge.requests.append(request)
                route = edge.match(request)
                if route is None:
                    status, body, ctype = 404, {"kind": "Status", "status": "Failure",
                                                "reason": "NotFound", "code": 404,
                                                "message": f"no route {url.path}"}, \
                        "application/json"
                else:
                    body = route.body(request) if callable(route.body) else route.body
                    status, ctype = route.status, route.content_type
                data = body if isinstance(body, bytes) else (
                    body.encode() if isinstance(body, str) else json.dumps(body).encode())
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _serve

            def log_message(self, *args):  # keep test output clean
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def route(self, method: str, pattern: str, status: int, body: Any | Callable,
              content_type: str = "application/json") -> None:
        """Answer `method` on paths fully matching `pattern`; later routes win."""
        self.routes.insert(0, Route(method, re.compile(pattern), status, body,
                                    content_type))

    def match(self, request: Request) -> Route | None:
        return next((r for r in self.routes if r.method == request.method
                     and r.pattern.fullmatch(request.path)), None)

    def __enter__(self) -> "ApiEdge":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
