"""gRPC's Python servers on an empty unary call: the thread-pool server `predict serve`
uses (`grpc.server`), the asyncio server (`grpc.aio.server`) and the asyncio server on
uvloop; what the server costs before any work of ours.

    python -m bench.grpc_servers [--rounds 3] [--calls 3000]

The three servers run at once, each in its own process, answering a 64-byte message to a
3,200-byte request (about the size of a one-image PredictRequest). One client at a time,
in its own process, sends `--calls` sequential calls to one server: grpc's sync stub (as
users call `Predict`) and a C++ client (bench/grpc_latency_client.cc, no client-side
Python in its figure); the servers are visited in turn in each round. Reported per
server and client: the p50 latency of each round and the server process's CPU
microseconds per call (from /proc), medians over the rounds. Writes
bench/results/grpc_servers.json.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench.serving_one_client import build_grpc_client

MODES = ("thread pool", "asyncio", "asyncio on uvloop")
CLIENTS = ("python stub", "C++")
SERVICE, METHOD = "bench.Echo", "Call"


def _identity(raw: bytes) -> bytes:
    return raw


def _handlers(fn):
    import grpc
    handler = grpc.unary_unary_rpc_method_handler(fn, request_deserializer=_identity,
                                                  response_serializer=_identity)
    return grpc.method_handlers_generic_handler(SERVICE, {METHOD: handler})


def serve(mode: str) -> None:
    """One server on a free port; prints the port, serves until killed."""
    import grpc
    if mode == "thread pool":
        from concurrent.futures import ThreadPoolExecutor
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers([_handlers(lambda request, context: b"y" * 64)])
        print(server.add_insecure_port("127.0.0.1:0"), flush=True)
        server.start()
        server.wait_for_termination()
        return

    async def answer(request, context):
        return b"y" * 64

    async def main():
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([_handlers(answer)])
        print(server.add_insecure_port("127.0.0.1:0"), flush=True)
        await server.start()
        await server.wait_for_termination()
    if mode == "asyncio on uvloop":
        import uvloop
        uvloop.install()
    asyncio.run(main())


def client(port: int, calls: int) -> None:
    """`calls` sequential calls after 200 to warm up; prints the p50 in microseconds."""
    import grpc
    import numpy as np
    call = grpc.insecure_channel(f"127.0.0.1:{port}").unary_unary(
        f"/{SERVICE}/{METHOD}", request_serializer=_identity, response_deserializer=_identity)
    body = b"x" * 3200
    for _ in range(200):
        call(body)
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        call(body)
        times.append(time.perf_counter() - began)
    print(round(1e6 * float(np.median(times)), 1))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args(argv)
    import numpy as np

    from bench import common
    load_before = common.load_average()
    servers = {}
    try:
        for mode in MODES:
            proc = subprocess.Popen([sys.executable, "-m", "bench.grpc_servers", "--serve", mode],
                                    stdout=subprocess.PIPE, text=True, start_new_session=True)
            servers[mode] = (proc, int(proc.stdout.readline()))  # type: ignore[union-attr]
        folder = tempfile.mkdtemp(prefix="grpc-servers-")
        cxx = build_grpc_client(folder)
        request_file = os.path.join(folder, "request")
        with open(request_file, "wb") as f:
            f.write(b"x" * 3200)
        cells = [(mode, client) for mode in MODES for client in CLIENTS]
        rounds: dict = {cell: [] for cell in cells}
        for _ in range(args.rounds):
            for mode, client_kind in cells:
                proc, port = servers[mode]
                command = [sys.executable, "-m", "bench.grpc_servers", "--client",
                           str(port), str(args.calls)] if client_kind == "python stub" else \
                    [cxx, f"127.0.0.1:{port}", f"/{SERVICE}/{METHOD}", request_file, "200",
                     str(args.calls)]
                cpu = common.cpu_seconds(proc.pid)
                done = subprocess.run(command, capture_output=True, text=True, check=True,
                                      timeout=600)
                cpu_us = 1e6 * (common.cpu_seconds(proc.pid) - cpu) / (args.calls + 200)
                out = done.stdout.strip().splitlines()[-1]
                p50 = float(out) if client_kind == "python stub" else \
                    round(1e6 * float(np.median(json.loads(out))), 1)
                rounds[(mode, client_kind)].append(
                    {"p50_us": p50, "server_cpu_us_per_call": round(cpu_us, 1)})
                print(mode, client_kind, rounds[(mode, client_kind)][-1], flush=True)
        shutil.rmtree(folder, ignore_errors=True)
    finally:
        for proc, _ in servers.values():
            common.stop_process(proc)
    results = {f"{mode}, {client_kind}": {
        "p50_us": float(np.median([r["p50_us"] for r in each])),
        "server_cpu_us_per_call": float(np.median(
            [r["server_cpu_us_per_call"] for r in each])),
        "rounds": each} for (mode, client_kind), each in rounds.items()}
    common.write_json("grpc_servers", {
        "what": "an empty unary call, one client in its own process, servers in turn",
        "calls_per_round": args.calls, "results": results,
        "command": "python -m bench.grpc_servers " + " ".join(argv or sys.argv[1:])},
        load_before)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    elif sys.argv[1:2] == ["--client"]:
        client(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
