"""A small HTTP proxy on 127.0.0.1 in front of the GCS emulator that counts the requests
it receives and, while told to, answers them with an error status instead of passing
them on: what a GCS outage looks like to gcsfs, request by request."""
from __future__ import annotations

import http.client
import http.server
import re
import threading
import urllib.parse


class FlakyGcs:
    """Forwards to `upstream` (http://127.0.0.1:PORT); `fail(pattern, status)` answers
    every request whose method and path (`GET /storage/v1/b/...`) match the regular
    expression with `status` until `heal()`. `count(pattern)` counts requests seen."""

    def __init__(self, upstream: str):
        self.upstream = urllib.parse.urlsplit(upstream)
        self.seen: list[str] = []
        self._failing: tuple[re.Pattern, int] | None = None
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _any(self):
                line = f"{self.command} {self.path}"
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy._lock:
                    proxy.seen.append(line)
                    failing = proxy._failing
                if failing and failing[0].search(line):
                    payload = b'{"error": {"code": %d, "message": "outage"}}' % failing[1]
                    self.send_response(failing[1])
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(proxy.upstream.hostname,
                                                  proxy.upstream.port, timeout=30)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "content-length",
                                                "transfer-encoding", "connection")}
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding",
                                         "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def fail(self, pattern: str, status: int = 503) -> None:
        with self._lock:
            self._failing = (re.compile(pattern), status)
            self.seen.clear()

    def heal(self) -> None:
        with self._lock:
            self._failing = None

    def count(self, pattern: str) -> int:
        with self._lock:
            return sum(bool(re.search(pattern, line)) for line in self.seen)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
