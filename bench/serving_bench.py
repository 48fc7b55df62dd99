"""Serving under concurrency: p50 and p99 latency and throughput at 1, 16 and 64
concurrent clients, REST and gRPC, with `--enable_batching` off and on, beside the
floor (the signature called in-process, one instance a call); then requests lost while
the model config is reloaded under load.

    python -m bench.serving_bench                  # about 3 minutes on 2 cores
    python -m bench.serving_bench --seconds 2 --clients 1,16

The floor is also called from 16 threads at once in process: the throughput REST and
gRPC should reach at 16 clients (`goals` in the JSON holds these ratios, and gRPC's
p50 over REST's at one client).

Every request holds one instance (a 784-pixel image and a key): what online traffic
looks like, and where batching can help. Each client is a thread with its own
keep-alive connection (REST: httpx; gRPC: TF Serving's own stub (predict.serving_api) on
one channel a client). Each cell runs for `--seconds`, with the server started fresh
for each batching setting (`--rest_api_num_threads=16`; batching: `--max_batch_size=64
--batch_timeout_micros=2000`). The reload phase serves a `--model_config_file` polled
every second and, while 8 REST and 8 gRPC clients predict without pause for
`--reload-seconds`, reloads the config over and over, alternating a second model in
and out, by gRPC HandleReloadConfigRequest and by rewriting the file; every failed
request is counted. The clients run in this process, so they share the
machine's 2 cores with the server: compare the rows with each other, not with a
bigger machine.

Each count of clients runs a second time with compiled clients in their own process
(REST: bench/latency_client.c, a connection each; gRPC: bench/grpc_latency_client.cc, a
channel each; the `, compiled clients` rows, with the server's CPU a request): no
client-side Python taking the GIL or the cores' time beside the server.

One client alone in its own process (`--rounds` interleaved rounds, medians): the
floor, REST with httpx, with http.client and with a small C client
(bench/latency_client.c, built with gcc: no client-side Python in the figure), gRPC with
the official stub and with a C++ client (bench/grpc_latency_client.cc), and
the empty route (GET /healthz: the HTTP round trip alone) with each REST client; the
goal is REST's p50 within 2x of the floor's. Beside them the server's own call in
process (`SavedModel.predict` on arrays, TensorFlow's executor as the server calls it):
what REST adds to that is HTTP and JSON. Then each server step of that request
timed alone in this process (JSON parse, decode, the model call, encode): with the
empty route they account for the REST request's time.

    python -m bench.serving_bench --one-client-only   # that part alone, 2-3 minutes

Writes bench/results/serving.json and bench/results/serving.png (--one-client-only:
bench/results/serving_one_client.json).
"""
from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from bench import common
from bench.serving_one_client import (build_client, build_grpc_client, compiled_clients,
                                      lone_client, request_files, summary)

CLIENTS = (1, 16, 64)
BATCHING = ["--enable_batching", "--max_batch_size=64", "--batch_timeout_micros=2000"]


def start_server(export_dir: str, extra: list,
                 source: str = "--model_dir") -> tuple[subprocess.Popen, str, int]:
    rest, grpc_port = common.free_ports(2)
    env = {**os.environ, **common.REPLICA_ENV,
           "PYTHONPATH": common.ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "predict", "serve", f"{source}={export_dir}",
         f"--rest_api_port={rest}", f"--port={grpc_port}", "--rest_api_num_threads=16",
         *extra],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 0.5)[0]:
            if proc.stdout.readline().startswith("serving model "):
                return proc, f"http://127.0.0.1:{rest}", grpc_port
    common.stop_process(proc)
    raise SystemExit("the prediction server did not start")


def mlp_export(prefix: str, kind: str = "mlp") -> tuple:
    """(scratch folder, the bundled MLP's export in it (`kind` "cnn": the CNN's), the
    image, the REST body, the gRPC PredictRequest) of the one-instance request every
    serving benchmark sends (both models take the same 784-pixel image)."""
    import tensorflow as tf
    from predict.serving_api.apis import predict_pb2

    from trainer import model as trainer_models
    from trainer.export import export

    scratch = tempfile.mkdtemp(prefix=prefix)
    export_dir = os.path.join(scratch, "model")
    export(kind, trainer_models.build(kind, seed=1).get_weights(), export_dir)
    image = np.random.default_rng(0).random((1, 784)).round(3).astype(np.float32)
    body = json.dumps({"instances": [{"image": image[0].tolist(), "key": 1}]}).encode()
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "default"
    request.inputs["image"].CopyFrom(tf.make_tensor_proto(image))
    request.inputs["key"].CopyFrom(tf.make_tensor_proto(np.array([1], np.int64)))
    return scratch, export_dir, image, body, request


def rest_maker(url: str, body: bytes):
    """A make_call for run_clients: each client its own httpx client posting body."""
    import httpx

    def make():
        client = httpx.Client(base_url=url, timeout=60)
        headers = {"content-type": "application/json"}

        def call():
            answer = client.post("/v1/models/default:predict", content=body,
                                 headers=headers)
            if answer.status_code != 200:
                raise RuntimeError(answer.text)
        return call
    return make


def grpc_maker(port: int, request):
    """A make_call for run_clients: each client its own channel sending request."""
    import grpc
    from predict.serving_api.apis import prediction_service_pb2_grpc

    def make():
        stub = prediction_service_pb2_grpc.PredictionServiceStub(
            grpc.insecure_channel(f"127.0.0.1:{port}"))
        return lambda: stub.Predict(request, timeout=60)
    return make


def run_clients(make_call, clients: int, seconds: float) -> dict:
    """Each client thread calls make_call()() in a loop for `seconds`; latencies in s."""
    latencies = [[] for _ in range(clients)]
    errors = []
    start_line = threading.Barrier(clients + 1)

    def loop(i):
        try:
            call = make_call()
            call()  # warm the connection
        except Exception as exc:  # report, do not hang the barrier
            errors.append(repr(exc))
            start_line.wait()
            return
        start_line.wait()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            try:
                call()
            except Exception as exc:
                errors.append(repr(exc))
                continue
            latencies[i].append(time.perf_counter() - t0)
    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start_line.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - began
    flat = [x for per in latencies for x in per]
    return summary(flat, wall, errors)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", default=",".join(map(str, CLIENTS)))
    parser.add_argument("--reload-seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds of the one-client-alone measurement")
    parser.add_argument("--one-client-only", action="store_true",
                        help="only the one-client-alone measurement and the server's "
                             "stages (a minute or two); writes serving_one_client.json")
    args = parser.parse_args(argv)
    clients_list = [int(c) for c in args.clients.split(",")]

    import tensorflow as tf

    load_before = common.load_average()
    scratch, export_dir, image, body, request = mlp_export("serving-bench-")

    if args.one_client_only:
        one_client_only(export_dir, args, argv, load_before)
        shutil.rmtree(scratch, ignore_errors=True)
        return
    signature = tf.saved_model.load(export_dir).signatures["serving_default"]
    image_t, key_t = tf.constant(image), tf.constant([1], tf.int64)
    floor_call = lambda: lambda: signature(image=image_t, key=key_t)  # noqa: E731
    results = {"floor": run_clients(floor_call, 1, args.seconds)}
    print(f"floor: {results['floor']}", flush=True)
    if 16 in clients_list:  # the goal at 16 clients: the same signature from 16 threads
        results["floor, 16 threads"] = run_clients(floor_call, 16, args.seconds)
        print(f"floor, 16 threads: {results['floor, 16 threads']}", flush=True)

    folder = tempfile.mkdtemp(prefix="serving-clients-")
    binaries = {"rest": build_client(folder), "grpc": build_grpc_client(folder)}
    request_files(folder)
    for batching in (False, True):
        proc, url, grpc_port = start_server(export_dir, BATCHING if batching else [])
        try:
            rest_call, grpc_call = rest_maker(url, body), grpc_maker(grpc_port, request)
            if not batching:
                results["one client in its own process"] = lone_client(
                    url, grpc_port, export_dir, rounds=args.rounds)
                print(f"one client in its own process: "
                      f"{results['one client in its own process']}", flush=True)
            for api, make in (("rest", rest_call), ("grpc", grpc_call)):
                for clients in clients_list:
                    row = f"{api} batching {'on' if batching else 'off'}"
                    cell = run_clients(make, clients, args.seconds)
                    results.setdefault(row, {})[str(clients)] = cell
                    print(f"{row}, {clients} clients: {cell}", flush=True)
            # the same counts of compiled clients, in their own process
            for api, target in (("rest", url), ("grpc", f"127.0.0.1:{grpc_port}")):
                for clients in clients_list:
                    row = f"{api} batching {'on' if batching else 'off'}, compiled clients"
                    cpu = common.cpu_seconds(proc.pid)
                    cell = compiled_clients(api, target, clients, args.seconds, folder,
                                            binaries)
                    cell["server_cpu_us_per_request"] = round(
                        1e6 * (common.cpu_seconds(proc.pid) - cpu) / max(cell["requests"], 1), 1)
                    results.setdefault(row, {})[str(clients)] = cell
                    print(f"{row}, {clients} clients: {cell}", flush=True)
        finally:
            common.stop_process(proc)
    shutil.rmtree(folder, ignore_errors=True)

    ratios = {}
    for api in ("rest", "grpc"):
        for clients in clients_list:
            off = results[f"{api} batching off"][str(clients)]["throughput_per_s"]
            on = results[f"{api} batching on"][str(clients)]["throughput_per_s"]
            ratios[f"{api} {clients} clients"] = round(on / off, 2) if off else None
    results["reload under load"] = reload_under_load(export_dir, scratch, body, request,
                                                     args.reload_seconds)
    print(f"reload under load: {results['reload under load']}", flush=True)
    one = results["rest batching off"].get("1")
    if one and one["p50_ms"]:
        results["rest p50 at 1 client over the floor's"] = round(
            one["p50_ms"] / results["floor"]["p50_ms"], 1)
    results["goals"] = goals(results)
    print(f"goals: {results['goals']}", flush=True)
    results["server stages at one client, p50 us"] = stages(export_dir)
    print(f"stages: {results['server stages at one client, p50 us']}", flush=True)
    payload = {
        "model": "mlp", "seconds_per_cell": args.seconds, "instances_per_request": 1,
        "server": "--rest_api_num_threads=16; batching: " + " ".join(BATCHING),
        "command": "python -m bench.serving_bench " + " ".join(argv or sys.argv[1:]),
        "note": "2 cores shared by the clients, the server and other work; single runs",
        "results": results, "throughput_ratio_batching_on_over_off": ratios,
    }
    common.write_json("serving", payload, load_before)
    plot(results, clients_list)
    shutil.rmtree(scratch, ignore_errors=True)


def goals(results: dict) -> dict:
    """Issue 46's ratios, from cells of this one run: at one client (alone in its own
    process, medians of the interleaved rounds) REST's and gRPC's p50 over the floor's
    and gRPC's over REST's for each REST client; at 16 clients each API's throughput over
    the floor called from 16 threads in process (goal: at least 1)."""
    out: dict = {}
    lone = results.get("one client in its own process", {})
    for rest in ("rest", "rest lean client", "rest C client"):
        if "grpc" in lone and rest in lone:
            out[f"grpc p50 over {rest}'s"] = round(
                lone["grpc"]["p50_ms"] / lone[rest]["p50_ms"], 2)
    if "grpc C++ client" in lone and "rest C client" in lone:
        out["grpc C++ client p50 over rest C client's"] = round(
            lone["grpc C++ client"]["p50_ms"] / lone["rest C client"]["p50_ms"], 2)
    floor16 = results.get("floor, 16 threads", {}).get("throughput_per_s")
    for row in ("rest batching off", "rest batching on", "grpc batching off",
                "grpc batching on", "rest batching off, compiled clients",
                "rest batching on, compiled clients", "grpc batching off, compiled clients",
                "grpc batching on, compiled clients"):
        cell = results.get(row, {}).get("16")
        if floor16 and cell:
            out[f"{row}, 16 clients, throughput over the floor's from 16 threads"] = round(
                cell["throughput_per_s"] / floor16, 2)
    return out


def one_client_only(export_dir: str, args, argv, load_before: list) -> None:
    proc, url, grpc_port = start_server(export_dir, [])
    try:
        lone = lone_client(url, grpc_port, export_dir, rounds=args.rounds)
    finally:
        common.stop_process(proc)
    print(f"one client in its own process: {lone}", flush=True)
    results = {"one client in its own process": lone,
               "server stages at one client, p50 us": stages(export_dir)}
    print(f"stages: {results['server stages at one client, p50 us']}", flush=True)
    common.write_json("serving_one_client", {
        "model": "mlp", "instances_per_request": 1,
        "server": "--rest_api_num_threads=16",
        "command": "python -m bench.serving_bench " + " ".join(argv or sys.argv[1:]),
        "note": "2 cores shared by the client, the server and other work",
        "results": results}, load_before)


def stages(export_dir: str, n: int = 2000) -> dict:
    """Where one REST request's time goes in the server, each step timed alone in this
    process on the request the clients send (p50, microseconds): what the HTTP round
    trip (the empty route above) does not hold."""
    import tensorflow as tf

    from predict.runtime import decode, instances, model as models
    from predict.api import http as rest_http
    model = models.load(export_dir)
    sig = model.signature(None)
    image = np.random.default_rng(0).random((1, 784)).round(3).astype(np.float32)
    body = json.dumps({"instances": [{"image": image[0].tolist(), "key": 1}]}).encode()
    parsed = instances.parse_json_bytes(body)
    decoded = [decode.decode_instance(parsed["instances"][0], sig)]
    batch = decode.stack(decoded, sig)
    outputs = model.predict(batch, sig.name)
    fn = tf.saved_model.load(export_dir).signatures["serving_default"]
    image_t, key_t = tf.constant(image), tf.constant([1], tf.int64)
    steps = {
        "floor (signature on ready tensors)": lambda: fn(image=image_t, key=key_t),
        "JSON parse (orjson, 15.8 KB)": lambda: instances.parse_json_bytes(body),
        "JSON parse (json, before)": lambda: json.loads(body.decode()),
        "decode and stack": lambda: decode.stack(
            [decode.decode_instance(parsed["instances"][0], sig)], sig),
        "model call (arrays in and out, TensorFlow's executor)":
            lambda: model.predict(batch, sig.name),
        "encode and JSON write": lambda: rest_http.dumps(
            {"predictions": decode.encode_rows(outputs, [False],
                                               decode.passthrough_key(sig))}),
    }
    out = {}
    for name, step in steps.items():
        for _ in range(100):
            step()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        out[name] = round(1e6 * float(np.median(times)), 1)
    return out


def reload_under_load(export_dir: str, scratch: str, body: bytes, request,
                      seconds: float) -> dict:
    """16 clients (8 REST, 8 gRPC) predict while the config is reloaded without pause,
    a second model alternating in and out, by gRPC and by the polled file."""
    import grpc
    from predict.serving_api.apis import model_management_pb2, model_service_pb2_grpc
    base = os.path.join(scratch, "base")
    shutil.copytree(export_dir, os.path.join(base, "1"))
    config = os.path.join(scratch, "models.config")
    one = f'config {{ name: "default" base_path: "{base}" }}'
    two = one + f' config {{ name: "other" base_path: "{base}" }}'
    with open(config, "w") as f:
        f.write(f"model_config_list {{ {one} }}")
    proc, url, grpc_port = start_server(config, ["--model_config_file_poll_wait_seconds=1"],
                                        source="--model_config_file")
    counts = {"requests": 0, "failed": 0, "reloads": 0, "failures": []}
    lock = threading.Lock()
    stop = threading.Event()

    def client(kind):
        call = (rest_maker(url, body) if kind == "rest" else
                grpc_maker(grpc_port, request))()
        while not stop.is_set():
            try:
                call()
                ok = True
            except Exception as exc:
                ok = False
                error = repr(exc)[:200]
            with lock:
                counts["requests"] += 1
                if not ok:
                    counts["failed"] += 1
                    counts["failures"] = (counts["failures"] + [error])[:5]

    def reloader():
        service = model_service_pb2_grpc.ModelServiceStub(
            grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
        i = 0
        while not stop.is_set():
            text = f"model_config_list {{ {two if i % 2 else one} }}"
            if i % 4 < 2:
                reload = model_management_pb2.ReloadConfigRequest()
                from google.protobuf import text_format
                text_format.Parse(text, reload.config)
                service.HandleReloadConfigRequest(reload, timeout=120)
            else:
                with open(config + ".tmp", "w") as f:
                    f.write(text)
                os.replace(config + ".tmp", config)
                stop.wait(1.5)
            i += 1
            with lock:
                counts["reloads"] += 1
    threads = [threading.Thread(target=client, args=(k,)) for k in ["rest"] * 8 + ["grpc"] * 8]
    threads.append(threading.Thread(target=reloader))
    try:
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join(timeout=120)
    finally:
        stop.set()
        common.stop_process(proc)
    return counts


def plot(results: dict, clients_list: list) -> None:
    plt = common.pyplot()
    fig, (tput, lat) = plt.subplots(1, 2, figsize=(12, 4.5))
    rows = [r for r in results if r.startswith(("rest", "grpc")) and
            isinstance(results[r], dict) and str(clients_list[0]) in results[r]]
    width = 0.8 / len(rows)
    for i, row in enumerate(rows):
        xs = [x + i * width for x in range(len(clients_list))]
        tput.bar(xs, [results[row][str(c)]["throughput_per_s"] for c in clients_list],
                 width, label=row)
        lat.bar(xs, [results[row][str(c)]["p99_ms"] or 0 for c in clients_list], width,
                label=row)
    floor = results["floor"]
    tput.axhline(floor["throughput_per_s"], color="#c44e52", linestyle="--",
                 label="floor: signature in-process, 1 thread")
    if "floor, 16 threads" in results:
        tput.axhline(results["floor, 16 threads"]["throughput_per_s"], color="#8172b2",
                     linestyle=":", label="floor: signature in-process, 16 threads")
    lat.axhline(floor["p99_ms"], color="#c44e52", linestyle="--", label="floor p99")
    for ax, title, unit in ((tput, "throughput, 1 instance a request", "requests/s"),
                            (lat, "p99 latency", "ms")):
        ax.set_xticks([x + width * (len(rows) - 1) / 2 for x in range(len(clients_list))])
        ax.set_xticklabels([f"{c} clients" for c in clients_list])
        ax.set_ylabel(unit)
        ax.set_title(title, fontsize=10)
        ax.set_yscale("log")
    tput.legend(fontsize=7)
    common.save_figure(fig, "serving")
    plt.close(fig)


if __name__ == "__main__":
    main()
