"""The model server's process: bind the ports, load the models, serve gRPC and the REST
API (predict.api.rest's routes on uvicorn, predict.api.http) until SIGTERM or SIGINT,
then stop both front ends, the batcher and the version watcher, and return (exit 0).

Readers wait for the ready lines: the first is always a model's (`serving model `), and
they are printed only once both front ends accept connections.
"""
from __future__ import annotations

import signal
import threading

import uvicorn

from predict.api import http as rest_http
from predict.models.repository import Repository
from predict.api.rest import PredictionService

KEEP_ALIVE = 75  # seconds an idle keep-alive connection stays open


def build_app(service: PredictionService):
    """The REST API as an ASGI app."""
    return rest_http.app(service.handle)


def serve(repository: Repository, *, host: str, rest_socket, grpc_port: int,
          threads: int, batcher=None, reload=None, health=None, after_start=None,
          **service_options) -> None:
    """Load the models, serve gRPC on grpc_port and REST on rest_socket (bound by the
    caller, rest_http.bind; None: REST off) until SIGTERM or SIGINT, then return (the
    process exits 0). `reload(proto)` answers HandleReloadConfigRequest;
    `after_start()` runs once the models are loaded (the config file poller)."""
    sock = rest_socket
    grpc_server = service = None
    try:
        repository.start()
        service = PredictionService(repository, threads=threads, batcher=batcher,
                                    health=health, **service_options)
        from predict.api import grpc_api
        grpc_server, bound = grpc_api.start(
            service, host, grpc_port, reload=reload,
            health=health.grpc_servicer() if health is not None else None)
        if after_start is not None:
            after_start()
        shown_host = f"[{host}]" if ":" in host else host
        # The first line is always a model's: readers wait for `serving model `.
        if sock is not None:
            base = f"http://{shown_host}:{sock.getsockname()[1]}/v1/models"
            lines = [f"serving model {name} at {base}/{name}"
                     for name in sorted(repository.models)]
        else:
            lines = [f"serving model {name} over gRPC (REST off: --rest_api_port=0)"
                     for name in sorted(repository.models)]
        lines.append(f"serving gRPC at {shown_host}:{bound}")
        if sock is None:
            stop = threading.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            print("\n".join(lines), flush=True)
            while not stop.wait(1):
                pass
            return
        # An idle keep-alive connection is closed after KEEP_ALIVE s: a version load
        # holds the GIL for seconds, and with uvicorn's 5 s default a client's next
        # request could meet a connection closed while the loop was starved. No proxy
        # headers middleware: nothing reads the client's address, and it is one more
        # coroutine a request.
        config = uvicorn.Config(build_app(service), log_level="warning", access_log=False,
                                lifespan="off", timeout_graceful_shutdown=10,
                                timeout_keep_alive=KEEP_ALIVE, proxy_headers=False)
        # uvicorn re-raises the signal it stopped for once it has shut down; with these
        # handlers in place that re-raise is a no-op and the process ends with status 0.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: None)
        _ReadyServer(config, "\n".join(lines)).run(sockets=[sock])
    finally:
        if grpc_server is not None:
            grpc_server.stop(grace=5).wait()
        if service is not None:
            service.calls.close()
        if batcher is not None:
            batcher.stop()
        repository.stop()


class _ReadyServer(uvicorn.Server):
    """Prints the ready line once uvicorn accepts connections."""

    def __init__(self, config, ready_line: str):
        super().__init__(config)
        self.ready_line = ready_line

    async def startup(self, sockets=None):
        await super().startup(sockets=sockets)
        if not self.should_exit:
            print(self.ready_line, flush=True)


__all__ = ["build_app", "serve", "KEEP_ALIVE"]
