"""The server's compiled small calls, on against off, side by side in one run.

Two servers of the same export (the MLP, one instance a request), one with
`--compile_small_calls=false` (TensorFlow's executor for every call) and one with the
default (a shape that comes back is compiled with XLA), both up at once; for REST
(httpx clients) and gRPC at 1, 16 and 64 clients, each cell runs `--seconds` against
one server then the other, the order alternating, over `--rounds` rounds: the
requests/s, p50 and p99 of each, their medians over the rounds and the ratio on/off.
The clients are threads of this process, sharing the 2 cores with both servers.

    python -m bench.serving_compiled            # about 3 minutes
    python -m bench.serving_compiled --rounds 5 --seconds 3

Writes bench/results/serving_compiled.json.
"""
from __future__ import annotations

import argparse
import json
import shutil

import numpy as np

from bench import common
from bench.serving_bench import grpc_maker, mlp_export, rest_maker, run_clients, \
    start_server

CLIENTS = (1, 16, 64)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default=",".join(map(str, CLIENTS)))
    args = parser.parse_args(argv)
    clients_list = [int(c) for c in args.clients.split(",")]

    load_before = common.load_average()
    scratch, export_dir, _, body, request = mlp_export("serving-compiled-")

    servers = {}
    try:
        for name, extra in (("off", ["--compile_small_calls=false"]), ("on", [])):
            servers[name] = start_server(export_dir, extra)
        cells: dict = {}
        for round_ in range(args.rounds):
            for api in ("rest", "grpc"):
                for clients in clients_list:
                    order = ("off", "on") if round_ % 2 == 0 else ("on", "off")
                    for name in order:
                        _, url, port = servers[name]
                        make = rest_maker(url, body) if api == "rest" else \
                            grpc_maker(port, request)
                        cell = run_clients(make, clients, args.seconds)
                        cells.setdefault(f"{api} {clients} clients", {}) \
                            .setdefault(name, []).append(cell)
                        print(f"round {round_} {api} {clients} clients, compiled {name}: "
                              f"{cell}", flush=True)
    finally:
        for proc, _, _ in servers.values():
            common.stop_process(proc)
        shutil.rmtree(scratch, ignore_errors=True)

    results: dict = {}
    for row, by in cells.items():
        out: dict = {}
        for name, runs in by.items():
            out[name] = {key: round(float(np.median([r[key] for r in runs])), 3)
                         for key in ("throughput_per_s", "p50_ms", "p99_ms")}
            out[name]["errors"] = sum(r["errors"] for r in runs)
            out[name]["throughput_each_round"] = [r["throughput_per_s"] for r in runs]
        out["throughput on / off"] = round(
            out["on"]["throughput_per_s"] / out["off"]["throughput_per_s"], 2)
        out["p50 on / off"] = round(out["on"]["p50_ms"] / out["off"]["p50_ms"], 2)
        results[row] = out
    common.write_json("serving_compiled", {
        "model": "mlp", "instances_per_request": 1, "rounds": args.rounds,
        "seconds_per_cell": args.seconds,
        "note": "both servers up at once; clients are threads of the benchmark, on the "
                "same 2 cores", "results": results}, load_before)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
