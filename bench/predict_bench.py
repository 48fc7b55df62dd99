"""Prediction speed: single-instance latency over HTTP, and throughput (instances/s) for
batches of 1, 32 and 256 in-process and over HTTP, each beside the floor: the loaded
SavedModel's signature called directly in a loop.

    python -m bench.predict_bench              # the MLP export (default)
    python -m bench.predict_bench --model cnn --seconds 2

Rows measured for each batch size:
- floor:       `tf.saved_model.load(...).signatures["serving_default"](...)` on tensors;
- interface:   `predict.runtime.model.Model.predict` on numpy column arrays (what every mode
               calls; adds the numpy -> tensor conversion and the output fetch);
- in-process:  the whole local path from parsed JSON instances: decode and check each
               instance, stack, predict, encode rows (what `predict local` does per batch);
- http:        one client (keep-alive) POSTing the same row-format body to a
               `python -m predict serve` process; the body is encoded once, up front;
- http x8:     eight clients at once (batch 1 only): what the thread pool buys.

Writes bench/results/predict.json and bench/results/predict.png.
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

BATCHES = (1, 32, 256)


def timed(fn, seconds: float, min_calls: int = 5) -> list[float]:
    """Seconds per call of fn, repeated for about `seconds` (after two warm-up calls)."""
    fn()
    fn()
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < min_calls:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def rate(times: list[float], batch: int) -> float:
    return batch * len(times) / sum(times)


def start_server(export_dir: str, max_instances: int) -> tuple[subprocess.Popen, str]:
    port, grpc_port = common.free_ports(2)
    env = {**os.environ, **common.REPLICA_ENV,
           "PYTHONPATH": common.ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "predict", "serve", "--model-dir", export_dir,
         "--rest_api_port", str(port), "--port", str(grpc_port),
         "--max-instances", str(max_instances), "--max-body-bytes",
         str(16 * 2**20)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=env, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 0.5)[0]:
            if proc.stdout.readline().startswith("serving model "):
                return proc, f"http://127.0.0.1:{port}/v1/models/default:predict"
    common.stop_process(proc)
    raise SystemExit("the prediction server did not start")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="time spent on each measurement")
    parser.add_argument("--latency-requests", type=int, default=500)
    args = parser.parse_args(argv)

    import httpx
    import tensorflow as tf

    from predict.runtime import decode, model as models
    from trainer import model as trainer_models
    from trainer.export import export

    load_before = common.load_average()
    scratch = tempfile.mkdtemp(prefix="predict-bench-")
    export_dir = os.path.join(scratch, "model")
    export(args.model, trainer_models.build(args.model, seed=1).get_weights(), export_dir)

    rng = np.random.default_rng(0)
    data = {b: rng.random((b, 784)).round(3).astype(np.float32) for b in BATCHES}
    keys = {b: np.arange(b, dtype=np.int64) for b in BATCHES}
    bodies = {b: json.dumps({"instances": [{"image": img.tolist(), "key": int(k)}
                                           for img, k in zip(data[b], keys[b])]}).encode()
              for b in BATCHES}

    signature = tf.saved_model.load(export_dir).signatures["serving_default"]
    model = models.load(export_dir)
    sig = model.signature()
    results = {"floor": {}, "interface": {}, "in-process": {}, "http": {}}
    for b in BATCHES:
        image, key = tf.constant(data[b]), tf.constant(keys[b])
        results["floor"][b] = rate(timed(lambda: signature(image=image, key=key),
                                         args.seconds), b)
        batch = {"image": data[b], "key": keys[b]}
        results["interface"][b] = rate(timed(lambda: model.predict(batch), args.seconds), b)
        parsed = json.loads(bodies[b])["instances"]

        def local_path():
            decoded = [decode.decode_instance(i, sig) for i in parsed]
            return decode.encode_rows(model.predict(decode.stack(decoded, sig)))
        results["in-process"][b] = rate(timed(local_path, args.seconds), b)
        print(f"batch {b}: floor {results['floor'][b]:,.0f}/s, interface "
              f"{results['interface'][b]:,.0f}/s, in-process {results['in-process'][b]:,.0f}/s",
              flush=True)

    proc, url = start_server(export_dir, max(BATCHES))
    try:
        headers = {"content-type": "application/json"}
        with httpx.Client(timeout=60) as client:
            def post(b):
                answer = client.post(url, content=bodies[b], headers=headers)
                assert answer.status_code == 200, answer.text
            for b in BATCHES:
                results["http"][b] = rate(timed(lambda: post(b), args.seconds), b)
                print(f"batch {b}: http {results['http'][b]:,.0f}/s", flush=True)
            post(1)
            latency = []
            for _ in range(args.latency_requests):
                start = time.perf_counter()
                post(1)
                latency.append(time.perf_counter() - start)
        floor_latency = timed(lambda: signature(image=tf.constant(data[1]),
                                                key=tf.constant(keys[1])), args.seconds)
        concurrent = http_concurrent(url, bodies[1], clients=8, seconds=args.seconds)
        print(f"batch 1: http x8 {concurrent:,.0f}/s", flush=True)
    finally:
        common.stop_process(proc)

    ms = lambda values, q: round(1000 * float(np.percentile(values, q)), 3)  # noqa: E731
    payload = {
        "model": args.model,
        "note": "2 cores shared with other work at the time; single runs, not averaged",
        "throughput_instances_per_s": {row: {str(b): round(v, 1) for b, v in by.items()}
                                       for row, by in results.items()},
        "http_x8_clients_batch_1_instances_per_s": round(concurrent, 1),
        "latency_ms_single_instance": {
            "http": {"p50": ms(latency, 50), "p99": ms(latency, 99),
                     "requests": len(latency)},
            "floor": {"p50": ms(floor_latency, 50), "p99": ms(floor_latency, 99)}},
    }
    common.write_json("predict", payload, load_before)
    plot(results, concurrent, payload["latency_ms_single_instance"], args.model)
    shutil.rmtree(scratch, ignore_errors=True)


def http_concurrent(url: str, body: bytes, *, clients: int, seconds: float) -> float:
    """Instances/s with `clients` threads each POSTing batch-1 bodies for `seconds`."""
    import httpx
    counts = [0] * clients
    end = time.perf_counter() + seconds

    def client_loop(i):
        with httpx.Client(timeout=60) as client:
            while time.perf_counter() < end:
                answer = client.post(url, content=body,
                                     headers={"content-type": "application/json"})
                assert answer.status_code == 200
                counts[i] += 1
    start = time.perf_counter()
    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - start)


def plot(results: dict, concurrent: float, latency: dict, model: str) -> None:
    plt = common.pyplot()
    fig, (ax, lat) = plt.subplots(1, 2, figsize=(11, 4.5),
                                  gridspec_kw={"width_ratios": [3, 1]})
    rows = list(results)
    width = 0.8 / len(rows)
    for i, row in enumerate(rows):
        values = [results[row][b] for b in BATCHES]
        bars = ax.bar([x + i * width for x in range(len(BATCHES))], values, width, label=row)
        for bar, value in zip(bars, values):
            ax.annotate(f"{value:,.0f}", (bar.get_x() + bar.get_width() / 2,
                                          bar.get_height()),
                        ha="center", va="bottom", fontsize=7)
    ax.axhline(concurrent, color="#888", linestyle=":", label="http, 8 clients, batch 1")
    ax.set_yscale("log")
    ax.set_xticks([x + width * (len(rows) - 1) / 2 for x in range(len(BATCHES))])
    ax.set_xticklabels([f"batch {b}" for b in BATCHES])
    ax.set_ylabel("instances/s (log)")
    ax.set_title(f"Prediction throughput, {model} export", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    names = ["floor p50", "floor p99", "http p50", "http p99"]
    values = [latency["floor"]["p50"], latency["floor"]["p99"], latency["http"]["p50"],
              latency["http"]["p99"]]
    lat.bar(names, values, color=["#4c72b0", "#4c72b0", "#dd8452", "#dd8452"])
    for x, v in enumerate(values):
        lat.annotate(f"{v:.2f}", (x, v), ha="center", va="bottom", fontsize=8)
    lat.set_ylabel("ms")
    lat.set_title("Single-instance latency", fontsize=10)
    lat.tick_params(axis="x", labelrotation=30, labelsize=8)
    common.save_figure(fig, "predict")
    plt.close(fig)


if __name__ == "__main__":
    main()
