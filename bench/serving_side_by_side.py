"""Two model servers up at once, measured in turn: a change's before and after in one
run, on the same export, under the same load.

    python -m bench.serving_side_by_side --before COMMIT [--rounds 5]
    python -m bench.serving_side_by_side --model cnn --labels defaults,tflite \
        --flags-after=--prefer_tflite_model

`--before` checks that commit out into a temporary worktree and serves from it beside
this tree; `--flags-before` / `--flags-after` add `predict serve` flags to one side
(both sides from this tree when no commit is given); `--batching` turns batching on
for both (bench.serving_bench's settings); `--model` serves the bundled MLP (default) or
CNN, with the model.tflite `python -m predict tflite` writes beside it when a side
prefers it (`--prefer_tflite_model`). Each round visits the servers in turn, and
for each: one C client (bench/latency_client.c) sending `--requests` one-image REST
predicts, one gRPC client (the official stub, in its own process) as many and one C++
gRPC client (bench/grpc_latency_client.cc) as many, then 16 REST and 16 gRPC client
threads of this process for `--seconds` each, and 16 compiled clients of each API in a
process of their own (`16 compiled clients`) as long; the server's
CPU seconds a request are read from /proc. The floor (the signature in process on
ready tensors, in its own process; and from 16 threads of this process, the 16-client
goal) is measured in each round too. `--labels` names the two sides. Medians over the
rounds; writes bench/results/NAME.json (`--name`, default serving_side_by_side).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading

import numpy as np

from bench import common
from bench.serving_bench import BATCHING, grpc_maker, mlp_export, rest_maker, run_clients
from bench.serving_one_client import (LONE_CLIENT, PREDICT_METHOD, build_client,
                                      build_grpc_client, compiled_clients, request_files)


def _start(root: str, export_dir: str, flags: list):
    rest, grpc_port = common.free_ports(2)
    env = {**os.environ, **common.REPLICA_ENV, "PYTHONPATH": root}
    log = tempfile.NamedTemporaryFile(prefix="side-by-side-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [sys.executable, "-m", "predict", "serve", f"--model_dir={export_dir}",
         f"--rest_api_port={rest}", f"--port={grpc_port}", "--rest_api_num_threads=16",
         *flags], cwd=root, stdout=subprocess.PIPE, stderr=log, text=True,
        env=env, start_new_session=True)
    assert proc.stdout is not None
    # the ready lines come in one write: read them as lines (a select on the pipe would
    # miss the second, already in the reader's buffer); a server stuck past 300 s is
    # stopped, which ends the reading
    timer = threading.Timer(300, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            if line.startswith("serving gRPC"):
                return proc, rest, grpc_port
    finally:
        timer.cancel()
    common.stop_process(proc)
    with open(log.name) as f:
        raise SystemExit(f"the server from {root} did not start: {f.read()[-1500:]}")


def _lone(command: list, env: dict) -> list:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    if done.returncode != 0:
        raise SystemExit(f"a client failed: {done.stderr[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cell(times: list, cpu: float, wall: float | None = None) -> dict:
    return {"p50_ms": round(1000 * float(np.percentile(times, 50)), 3),
            "p99_ms": round(1000 * float(np.percentile(times, 99)), 3),
            "throughput_per_s": round(len(times) / (wall or sum(times)), 1),
            "server_cpu_us_per_request": round(1e6 * cpu / max(len(times), 1), 1)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a commit to serve beside this tree")
    parser.add_argument("--flags-before", default="")
    parser.add_argument("--flags-after", default="")
    parser.add_argument("--batching", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--name", default="serving_side_by_side")
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--labels", default="before,after",
                        help="the two sides' names in the results")
    args = parser.parse_args(argv)
    load_before = common.load_average()
    scratch, export_dir, image, body, request = mlp_export("side-by-side-", args.model)
    if "--prefer_tflite_model" in args.flags_before + args.flags_after:
        subprocess.run([sys.executable, "-m", "predict", "tflite", "--model-dir",
                        export_dir], check=True, cwd=common.ROOT,
                       env={**os.environ, "PYTHONPATH": common.ROOT})
    trees = {"before": common.ROOT, "after": common.ROOT}
    worktree = None
    if args.before:
        worktree = os.path.join(scratch, "before")
        subprocess.run(["git", "-C", common.ROOT, "worktree", "add", "--detach", worktree,
                        args.before], check=True, capture_output=True)
        trees["before"] = worktree
    extra = BATCHING if args.batching else []
    flags = {"before": args.flags_before.split() + extra,
             "after": args.flags_after.split() + extra}
    labels = dict(zip(("before", "after"), args.labels.split(","), strict=True))
    import tensorflow as tf
    signature = tf.saved_model.load(export_dir).signatures["serving_default"]
    image_t, key_t = tf.constant(image), tf.constant([1], tf.int64)
    floor16 = lambda: lambda: signature(image=image_t, key=key_t)  # noqa: E731
    client = build_client(scratch)
    binaries = {"rest": client, "grpc": build_grpc_client(scratch)}
    body_file, request_file = request_files(scratch)
    env = {**os.environ, **common.REPLICA_ENV}
    servers: dict = {}
    cells: dict = {}
    try:
        for side in ("before", "after"):
            servers[side] = _start(trees[side], export_dir, flags[side])
        for _ in range(args.rounds):
            floor = _lone([sys.executable, "-c", LONE_CLIENT, "floor", export_dir,
                           str(args.requests)], env)
            cells.setdefault("floor, one client", []).append(_cell(floor, 0.0))
            cells.setdefault("floor, 16 threads", []).append(
                run_clients(floor16, 16, args.seconds) | {"server_cpu_us_per_request": 0.0})
            for side, (proc, rest, grpc_port) in servers.items():
                side = labels[side]
                cpu = common.cpu_seconds(proc.pid)
                times = _lone([client, "127.0.0.1", str(rest), "POST",
                               "/v1/models/default:predict", body_file, "30",
                               str(args.requests)], env)
                cells.setdefault(f"{side}: REST, C client", []).append(
                    _cell(times, common.cpu_seconds(proc.pid) - cpu))
                cpu = common.cpu_seconds(proc.pid)
                times = _lone([sys.executable, "-c", LONE_CLIENT, "grpc",
                               f"127.0.0.1:{grpc_port}", str(args.requests)], env)
                cells.setdefault(f"{side}: gRPC", []).append(
                    _cell(times, common.cpu_seconds(proc.pid) - cpu))
                cpu = common.cpu_seconds(proc.pid)
                times = _lone([binaries["grpc"], f"127.0.0.1:{grpc_port}", PREDICT_METHOD,
                               request_file, "30", str(args.requests)], env)
                cells.setdefault(f"{side}: gRPC, C++ client", []).append(
                    _cell(times, common.cpu_seconds(proc.pid) - cpu))
                for api, target in (("REST", f"http://127.0.0.1:{rest}"),
                                    ("gRPC", f"127.0.0.1:{grpc_port}")):
                    cpu = common.cpu_seconds(proc.pid)
                    got = compiled_clients(api.lower(), target, 16, args.seconds, scratch,
                                           binaries)
                    got["server_cpu_us_per_request"] = round(
                        1e6 * (common.cpu_seconds(proc.pid) - cpu) / max(got["requests"], 1), 1)
                    cells.setdefault(f"{side}: {api}, 16 compiled clients", []).append(got)
                for api, make in (("REST", rest_maker(f"http://127.0.0.1:{rest}", body)),
                                  ("gRPC", grpc_maker(grpc_port, request))):
                    cpu = common.cpu_seconds(proc.pid)
                    got = run_clients(make, 16, args.seconds)
                    got["server_cpu_us_per_request"] = round(
                        1e6 * (common.cpu_seconds(proc.pid) - cpu) / max(got["requests"], 1), 1)
                    cells.setdefault(f"{side}: {api}, 16 clients", []).append(got)
            print(json.dumps({k: v[-1] for k, v in cells.items()}), flush=True)
    finally:
        for proc, _, _ in servers.values():
            common.stop_process(proc)
        if worktree is not None:
            subprocess.run(["git", "-C", common.ROOT, "worktree", "remove", "--force",
                            worktree], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    keys = ("p50_ms", "p99_ms", "throughput_per_s", "server_cpu_us_per_request")
    results: dict = {name: {k: float(np.median([r[k] for r in rounds])) for k in keys}
               | {"p50_ms_each_round": [r["p50_ms"] for r in rounds]}
               for name, rounds in cells.items()}
    floor = results["floor, one client"]["p50_ms"]
    for name, row in results.items():
        if "16" not in name and name != "floor, one client":
            row["p50_over_the_floor"] = round(row["p50_ms"] / floor, 2)
    floor16_rate = results["floor, 16 threads"]["throughput_per_s"]
    for name, row in results.items():
        if name.endswith(("16 clients", "16 compiled clients")):
            row["throughput_over_the_floor_from_16_threads"] = round(
                row["throughput_per_s"] / floor16_rate, 2)
    common.write_json(args.name, {
        "labels": labels, "model": args.model,
        "before": args.before or "this tree", "flags_before": flags["before"],
        "flags_after": flags["after"], "requests_per_round": args.requests,
        "seconds_per_16_client_cell": args.seconds, "results": results,
        "command": "python -m bench.serving_side_by_side " + " ".join(argv or sys.argv[1:])},
        load_before)


if __name__ == "__main__":
    main()
