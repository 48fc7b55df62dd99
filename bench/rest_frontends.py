"""HTTP front ends for the REST API, without the model: uvicorn with the protocol and
loop `predict serve` uses (httptools on uvloop, predict.api.http), granian (a Rust HTTP
server) embedded in the process on the same ASGI app, and granian's own RSGI interface.

    python -m bench.rest_frontends [--rounds 5] [--requests 3000]

Every server runs the same routes: `GET /healthz` (a short JSON answer: the HTTP round
trip alone) and `POST /v1/models/default:predict`, which reads the body, parses it
(predict.runtime.instances) and answers a fixed 10-score prediction as JSON: everything a
request costs in front of the model call. The servers run at once, each in its own
process; one client at a time (bench/latency_client.c, built with gcc: no Python in the
client) sends sequential requests on one keep-alive connection to one server, the
servers visited in turn in each round. Reported per server and route: the p50 and p99
of each round and the server process's CPU microseconds a request, medians over the
rounds. Writes bench/results/rest_frontends.json. granian must be importable (pip
install granian) for its two rows; without it they are skipped.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

SERVERS = ("uvicorn (predict serve's)", "granian, ASGI", "granian, RSGI")
ROUTES = {"empty route": ("GET", "/healthz"),
          "predict route, no model": ("POST", "/v1/models/default:predict")}
ANSWER = {"predictions": [{"scores": [0.1] * 10, "key": 1}]}


def _answer(method: str, path: str, body: bytes) -> bytes:
    from predict.runtime.instances import parse_json_bytes
    from predict.api.http import dumps
    if method == "POST":
        parse_json_bytes(body)
        return dumps(ANSWER)
    return dumps({"status": "SERVING"})


def serve(kind: str, port: int) -> None:
    """One server on `port`; prints `ready` once it accepts, serves until killed."""
    from predict.api import http as rest_http

    async def handle(request):
        body = b"".join([c async for c in request.stream()])
        return 200, _answer(request.method, request.path, body), {}, b"application/json"

    asgi = rest_http.app(handle)
    if kind == SERVERS[0]:
        import uvicorn
        sock = rest_http.bind("127.0.0.1", port)
        config = uvicorn.Config(asgi, log_level="warning", access_log=False, lifespan="off",
                                http=rest_http.PROTOCOL, loop=rest_http.LOOP,
                                proxy_headers=False)

        class Ready(uvicorn.Server):
            async def startup(self, sockets=None):
                await super().startup(sockets=sockets)
                print("ready", flush=True)
        Ready(config).run(sockets=[sock])
        return
    from granian.constants import Interfaces
    from granian.server.embed import Server

    async def rsgi(scope, proto):
        body = await proto()
        proto.response_bytes(200, [("content-type", "application/json")],
                             _answer(scope.method, scope.path, body))

    target, interface = (asgi, Interfaces.ASGI) if kind == SERVERS[1] else \
        (rsgi, Interfaces.RSGI)
    server = Server(target, address="127.0.0.1", port=port, interface=interface,
                    log_enabled=False, runtime_threads=1)

    async def main():
        asyncio.get_running_loop().call_later(1.0, lambda: print("ready", flush=True))
        await server.serve()
    _uvloop_run(main())


def _uvloop_run(coro) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
        return
    uvloop.run(coro)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args(argv)
    from bench import common
    from bench.serving_one_client import build_client
    try:
        import granian  # noqa: F401
        kinds: tuple = SERVERS
    except ImportError:
        kinds = SERVERS[:1]
    load_before = common.load_average()
    folder = tempfile.mkdtemp(prefix="rest-frontends-")
    client = build_client(folder)
    body_file = os.path.join(folder, "body.json")
    image = np.random.default_rng(0).random(784).round(3)
    with open(body_file, "wb") as f:  # the one-image body bench.serving_bench sends
        f.write(json.dumps({"instances": [{"image": image.tolist(), "key": 1}]}).encode())
    servers: dict = {}
    env = {**os.environ, "PYTHONPATH": common.ROOT + os.pathsep
           + os.environ.get("PYTHONPATH", "")}
    try:
        for kind, port in zip(kinds, common.free_ports(len(kinds)), strict=True):
            proc = subprocess.Popen([sys.executable, "-m", "bench.rest_frontends", "--serve",
                                     kind, str(port)], stdout=subprocess.PIPE, text=True,
                                    env=env, start_new_session=True)
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit(f"the {kind} server did not start")
            servers[kind] = (proc, port)
        cells: dict = {(k, r): [] for k in kinds for r in ROUTES}
        for _ in range(args.rounds):
            for route, (method, path) in ROUTES.items():
                for kind, (proc, port) in servers.items():
                    cpu = common.cpu_seconds(proc.pid)
                    done = subprocess.run(
                        [client, "127.0.0.1", str(port), method, path,
                         body_file if method == "POST" else "-", "200", str(args.requests)],
                        capture_output=True, text=True, timeout=600)
                    if done.returncode != 0:
                        raise SystemExit(f"{kind} {route}: {done.stderr.strip()}")
                    times = json.loads(done.stdout)
                    cell = {"p50_us": round(1e6 * float(np.percentile(times, 50)), 1),
                            "p99_us": round(1e6 * float(np.percentile(times, 99)), 1),
                            "server_cpu_us": round(1e6 * (common.cpu_seconds(proc.pid) - cpu)
                                                   / (args.requests + 200), 1)}
                    cells[kind, route].append(cell)
                    print(kind, route, cell, flush=True)
    finally:
        for proc, _ in servers.values():
            common.stop_process(proc)
    results: dict = {}
    for (kind, route), rounds in cells.items():
        results.setdefault(kind, {})[route] = {
            key: float(np.median([c[key] for c in rounds]))
            for key in ("p50_us", "p99_us", "server_cpu_us")} | {"rounds": rounds}
    versions = {}
    if len(kinds) > 1:
        from importlib.metadata import version
        versions["granian"] = version("granian")
    common.write_json("rest_frontends", {
        "what": "REST front ends without the model, one C client at a time, servers in turn",
        **versions,
        "requests_per_round": args.requests, "results": results,
        "command": "python -m bench.rest_frontends " + " ".join(argv or sys.argv[1:])},
        load_before)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2], int(sys.argv[3]))
    else:
        main()
