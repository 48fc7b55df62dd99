"""The one-client part of bench/serving_bench.py: one client alone in its own process,
sequential requests on one keep-alive connection, beside the floor measured the same
way; REST with httpx, http.client and a small C client (bench/latency_client.c, built
with gcc here), gRPC with the official stub and with a C++ client
(bench/grpc_latency_client.cc, built against Debian's gRPC C++ library), and the empty
route (GET /healthz) with each REST client. `compiled_clients` runs many of the compiled
clients at once, in their own process: the 16-client figures without client-side
Python sharing the cores' time with the server.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from bench import common


def summary(latencies: list, wall: float, errors=()) -> dict:
    ms = lambda q: round(1000 * float(np.percentile(latencies, q)), 3)  # noqa: E731
    return {"requests": len(latencies), "errors": len(errors),
            "throughput_per_s": round(len(latencies) / wall, 1),
            "p50_ms": ms(50) if latencies else None, "p99_ms": ms(99) if latencies else None}


LONE_CLIENT = r"""
import json, sys, time
import numpy as np
api, target, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
image = np.random.default_rng(0).random((1, 784)).round(3).astype(np.float32)
body = json.dumps({"instances": [{"image": image[0].tolist(), "key": 1}]}).encode()
headers = {"content-type": "application/json"}
if api in ("rest", "rest empty route"):
    import httpx
    client = httpx.Client(base_url=target, timeout=60)
    call = (lambda: client.post("/v1/models/default:predict", content=body, headers=headers)) \
        if api == "rest" else (lambda: client.get("/healthz"))
elif api in ("rest lean client", "lean empty route"):
    import http.client
    host, port = target.split("//")[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    method, path, data = ("POST", "/v1/models/default:predict", body) \
        if api == "rest lean client" else ("GET", "/healthz", None)
    def call():
        conn.request(method, path, data, headers)
        answer = conn.getresponse()
        answer.read()
        assert answer.status == 200, answer.status
elif api == "grpc":
    import grpc, tensorflow as tf
    from predict.serving_api.apis import predict_pb2, prediction_service_pb2_grpc
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "default"
    request.inputs["image"].CopyFrom(tf.make_tensor_proto(image))
    request.inputs["key"].CopyFrom(tf.make_tensor_proto(np.array([1], np.int64)))
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(target))
    call = lambda: stub.Predict(request, timeout=60)
elif api == "server's call in process":  # what the server runs, without HTTP or JSON
    from predict.runtime import model as models
    model = models.load(target)
    batch = {"image": image, "key": np.array([1], np.int64)}
    call = lambda: model.predict(batch)
else:  # the floor: the signature in this process, on ready tensors
    import tensorflow as tf
    fn = tf.saved_model.load(target).signatures["serving_default"]
    image_t, key_t = tf.constant(image), tf.constant([1], tf.int64)
    call = lambda: fn(image=image_t, key=key_t)
for _ in range(30):
    call()
times = []
for _ in range(n):
    t0 = time.perf_counter()
    call()
    times.append(time.perf_counter() - t0)
print(json.dumps(times))
"""
LONE_KINDS = ("floor", "server's call in process", "rest", "rest lean client",
              "rest C client", "grpc", "grpc C++ client",
              "rest empty route", "lean empty route", "C empty route")
CLIENT_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "latency_client.c")
GRPC_CLIENT_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                  "grpc_latency_client.cc")
PREDICT_METHOD = "/tensorflow.serving.PredictionService/Predict"


def build_client(folder: str) -> str:
    """bench/latency_client.c compiled into folder (gcc -O2)."""
    if shutil.which("gcc") is None:
        raise SystemExit("error: the one-client measurement builds a C client with gcc; "
                         "install it (apt-get install gcc)")
    binary = os.path.join(folder, "latency_client")
    subprocess.run(["gcc", "-O2", "-pthread", "-o", binary, CLIENT_SOURCE], check=True)
    return binary


def request_files(folder: str) -> tuple[str, str]:
    """(REST body file, serialized PredictRequest file) of the one-image request every
    serving client sends, written into folder."""
    from predict.runtime import tensors
    from predict.serving_api.apis import predict_pb2
    image = np.random.default_rng(0).random((1, 784)).round(3).astype(np.float32)
    body_file, request_file = os.path.join(folder, "body.json"), os.path.join(folder,
                                                                               "request")
    with open(body_file, "wb") as f:  # the body LONE_CLIENT sends
        f.write(json.dumps({"instances": [{"image": image[0].tolist(), "key": 1}]}).encode())
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "default"
    tensors.fill(request.inputs["image"], image)
    tensors.fill(request.inputs["key"], np.array([1], np.int64))
    with open(request_file, "wb") as f:
        f.write(request.SerializeToString())
    return body_file, request_file


def compiled_clients(api: str, target: str, clients: int, seconds: float,
                     folder: str, binaries: dict) -> dict:
    """`clients` compiled clients at once in their own process (REST: the C client, a
    connection each; gRPC: the C++ client, a channel each), for `seconds` after 20 calls
    each to warm up: summary() of every call's latency."""
    body_file, request_file = os.path.join(folder, "body.json"), os.path.join(folder,
                                                                               "request")
    if api == "rest":
        host, port = target.split("//")[1].rsplit(":", 1)
        command = [binaries["rest"], host, port, "POST", "/v1/models/default:predict",
                   body_file, "20", "0", str(clients), str(seconds)]
    else:
        command = [binaries["grpc"], target, PREDICT_METHOD, request_file, "20", "0",
                   str(clients), str(seconds)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"the compiled {api} clients failed: {done.stderr[-1500:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return summary(got["times"], got["wall"])


def _lone_command(kind: str, target: str, n: int, client: str, body_file: str,
                  grpc_client: str = "", request_file: str = "") -> list:
    if kind == "grpc C++ client":
        return [grpc_client, target, PREDICT_METHOD, request_file, "30", str(n)]
    if kind in ("rest C client", "C empty route"):
        host, port = target.split("//")[1].rsplit(":", 1)
        method, path, data = ("POST", "/v1/models/default:predict", body_file) \
            if kind == "rest C client" else ("GET", "/healthz", "-")
        return [client, host, port, method, path, data, "30", str(n)]
    return [sys.executable, "-c", LONE_CLIENT, kind, target, str(n)]


def build_grpc_client(folder: str) -> str:
    """bench/grpc_latency_client.cc compiled into folder (g++ -O2 against Debian's
    gRPC C++ library): gRPC timed without a Python client's own time."""
    if shutil.which("g++") is None or subprocess.run(
            ["pkg-config", "--exists", "grpc++"], capture_output=True).returncode != 0:
        raise SystemExit("error: the gRPC figures build a C++ client against gRPC's C++ "
                         "library; install it (apt-get install g++ pkg-config "
                         "libgrpc++-dev)")
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "grpc++"], check=True,
                           capture_output=True, text=True).stdout.split()
    binary = os.path.join(folder, "grpc_latency_client")
    subprocess.run(["g++", "-O2", "-std=c++17", "-o", binary, GRPC_CLIENT_SOURCE, *flags],
                   check=True)
    return binary


def lone_client(url: str, grpc_port: int, export_dir: str, n: int = 400,
                rounds: int = 3) -> dict:
    """p50/p99 of one client alone in its own process (the threads above share this
    process with TensorFlow), sequential requests on one keep-alive connection, and the
    floor measured the same way (the signature called in a fresh process); `rounds`
    rounds, the kinds interleaved in each, and the median of each figure over them.
    REST three times: with httpx (as the threads above), with the standard library's
    http.client (a lighter client) and with bench/latency_client.c (one C client: what
    is left is the server's and the kernel's); gRPC twice, with the official stub and
    with bench/grpc_latency_client.cc. The empty route (GET /healthz) is the HTTP round
    trip alone, without JSON or the model."""
    per: dict = {kind: [] for kind in LONE_KINDS}
    targets = {"floor": export_dir, "server's call in process": export_dir,
               "grpc": f"127.0.0.1:{grpc_port}", "grpc C++ client": f"127.0.0.1:{grpc_port}"}
    folder = tempfile.mkdtemp(prefix="serving-client-")
    client, grpc_client = build_client(folder), build_grpc_client(folder)
    body_file, request_file = request_files(folder)
    for _ in range(rounds):
        for kind in LONE_KINDS:
            done = subprocess.run(_lone_command(kind, targets.get(kind, url), n, client,
                                                body_file, grpc_client, request_file),
                                  capture_output=True, text=True, timeout=600,
                                  env={**os.environ, **common.REPLICA_ENV})
            if done.returncode != 0:
                raise SystemExit(f"the lone {kind} client failed: {done.stderr[-2000:]}")
            times = json.loads(done.stdout.strip().splitlines()[-1])
            per[kind].append(summary(times, sum(times)))
    out: dict = {}
    for kind, cells in per.items():
        out[kind] = {"p50_ms": round(float(np.median([c["p50_ms"] for c in cells])), 3),
                     "p99_ms": round(float(np.median([c["p99_ms"] for c in cells])), 3),
                     "throughput_per_s": round(float(np.median(
                         [c["throughput_per_s"] for c in cells])), 1),
                     "p50_ms_each_round": [c["p50_ms"] for c in cells]}
    shutil.rmtree(folder, ignore_errors=True)
    for kind in ("rest", "rest lean client", "rest C client", "grpc", "grpc C++ client"):
        ratios = [c["p50_ms"] / f["p50_ms"] for c, f in zip(per[kind], per["floor"],
                                                             strict=True)]
        out[f"{kind} p50 over the floor's"] = round(float(np.median(ratios)), 2)
    # the server's own call (arrays in and out): what REST adds to it is HTTP and JSON
    ratios = [c["p50_ms"] / f["p50_ms"] for c, f in zip(
        per["rest C client"], per["server's call in process"], strict=True)]
    out["rest C client p50 over the server's call's"] = round(float(np.median(ratios)), 2)
    out["rounds"] = rounds
    return out


__all__ = ["lone_client", "summary", "build_client", "build_grpc_client",
           "compiled_clients", "request_files", "LONE_KINDS"]
