"""Batch prediction: examples/s of `jobs submit prediction` with 1, 2 and 4 workers,
beside `python -m predict batch` (one process) and the in-process floor (the SavedModel's
signature called in a loop on ready tensors, batch 64), for the bundled CNN and a tabular
model (four numbers and a category through an embedding), all in one run.

    python -m bench.batch_predict                  # both models
    python -m bench.batch_predict --models tabular --cnn-instances 2000

Each job reads one JSON-lines file, cut into 4 x workers ranges. Two rates a row:
- end to end: instances / wall time of the command (what a user waits, TensorFlow's
  start and the export's load included);
- predicting: instances / the time from the first shard's start to the last shard's
  end (the workers' `shard i published` log lines), the export loaded; for `predict
  batch`, its `run` timed in-process on the loaded export (what the command does after
  its start).
Scaling is `predicting` at N workers over 1 worker; the goal is 0.8 x N on N idle cores.

Writes bench/results/batch_predict.json.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench import common

WORKERS = (1, 2, 4)


def export_cnn(path: str) -> None:
    from trainer import model as trainer_models
    from trainer.export import export
    export("cnn", trainer_models.build("cnn", seed=1).get_weights(), path)


def export_tabular(path: str) -> None:
    import keras
    import tensorflow as tf

    from mljob.training import Serving
    from mljob.training.export import export

    def build():
        num = keras.Input(shape=(4,), dtype="float32", name="num")
        cat = keras.Input(shape=(), dtype="int64", name="cat")
        x = keras.layers.Concatenate()([num, keras.layers.Embedding(5, 3)(cat)])
        x = keras.layers.Dense(32, activation="relu")(x)
        return keras.Model({"num": num, "cat": cat}, keras.layers.Dense(3)(x))
    keras.utils.set_random_seed(1)
    serving = Serving(inputs={"num": tf.TensorSpec([None, 4], tf.float32),
                              "cat": tf.TensorSpec([None], tf.int64)},
                      outputs=lambda logits: {"probabilities": tf.nn.softmax(logits)})
    export(build, build().get_weights(), path, serving)


def instances(model: str, n: int) -> tuple[list[dict], dict]:
    """n JSON instances, and the same as tensors' arrays for the floor."""
    rng = np.random.default_rng(0)
    if model == "cnn":
        images = rng.random((n, 784)).round(3).astype(np.float32)
        keys = np.arange(n, dtype=np.int64)
        return ([{"image": img.tolist(), "key": int(k)}
                 for img, k in zip(images, keys, strict=True)],
                {"image": images, "key": keys})
    num = rng.normal(size=(n, 4)).round(3).astype(np.float32)
    cat = rng.integers(0, 5, size=n).astype(np.int64)
    keys = np.arange(n, dtype=np.int64)  # the export passes the instance key through
    return ([{"num": v.tolist(), "cat": int(c), "key": int(k)}
             for v, c, k in zip(num, cat, keys, strict=True)],
            {"num": num, "cat": cat, "key": keys})


def floor(export_dir: str, arrays: dict, seconds: float, batch: int = 64) -> float:
    import tensorflow as tf
    signature = tf.saved_model.load(export_dir).signatures["serving_default"]
    tensors = {k: tf.constant(v[:batch]) for k, v in arrays.items()}
    signature(**tensors)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        signature(**tensors)
        calls += 1
    return calls * batch / (time.perf_counter() - start)


def _env(home: str) -> dict:
    return {**os.environ, **common.REPLICA_ENV, "MLJOB_HOME": home,
            "MLJOB_PREDICTION_SPLIT_BYTES": "65536",
            "PYTHONPATH": common.ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


def predict_batch_in_process(export_dir: str, inputs: str, out: str) -> float:
    """Seconds `predict batch` takes on the loaded export (its start and load left out)."""
    from predict.offline import batch
    from predict.runtime import model as models
    model = models.load(export_dir)
    batch.run(model, [inputs], "text", out + "-warm", batch_size=64, progress=_Quiet())
    start = time.perf_counter()
    batch.run(model, [inputs], "text", out, batch_size=64, progress=_Quiet())
    return time.perf_counter() - start


class _Quiet:
    def update(self, summary) -> None:
        pass

    def done(self) -> None:
        pass


def run_batch(export_dir: str, inputs: str, out: str, home: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "predict", "batch", "--model-dir", export_dir,
                    "--input-paths", inputs, "--data-format", "text", "--output-path", out],
                   env=_env(home), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


SHARD_LINE = re.compile(r"shard [0-9]+ published: .* \(from ([0-9.]+) to ([0-9.]+)\)")


def run_job(export_dir: str, inputs: str, out: str, home: str, workers: int,
            job_id: str, cores: int | None = None) -> tuple[float, float]:
    """(wall seconds, seconds from the first shard's start to the last one's end);
    `cores`: the job pinned to that many of the machine's cores (its workers size their
    threads to them)."""
    start = time.perf_counter()
    pin = None if cores is None else (lambda: os.sched_setaffinity(0, set(range(cores))))
    subprocess.run([sys.executable, "-m", "submit", "jobs", "submit", "prediction", job_id,
                    "--model-dir", export_dir, "--input-paths", inputs, "--output-path", out,
                    "--data-format", "text", "--region", "us-central1",
                    "--max-worker-count", str(workers)],
                   env=_env(home), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, cwd=common.ROOT, preexec_fn=pin)
    wall = time.perf_counter() - start
    spans = []
    for path in glob.glob(os.path.join(home, "runs", job_id, "logs", "worker-replica-*.log")):
        for line in open(path):
            match = SHARD_LINE.search(line)
            if match:
                spans.append((float(match.group(1)), float(match.group(2))))
    return wall, max(e for _, e in spans) - min(s for s, _ in spans)


def bench_model(model: str, n: int, seconds: float, scratch: str) -> dict:
    export_dir = os.path.join(scratch, model, "model")
    (export_cnn if model == "cnn" else export_tabular)(export_dir)
    rows, arrays = instances(model, n)
    inputs = os.path.join(scratch, model, "in.json")
    with open(inputs, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    home = os.path.join(scratch, model, "home")
    result: dict = {"instances": n, "input_mb": round(os.path.getsize(inputs) / 1e6, 1)}
    result["floor"] = floor(export_dir, arrays, seconds)
    print(f"{model}: floor {result['floor']:,.0f}/s", flush=True)
    wall = run_batch(export_dir, inputs, os.path.join(scratch, model, "out-batch"), home)
    steady = predict_batch_in_process(export_dir, inputs,
                                      os.path.join(scratch, model, "out-in-process"))
    result["predict_batch"] = {"wall_s": round(wall, 2), "end_to_end": n / wall,
                               "predicting": n / steady}
    print(f"{model}: predict batch {n / wall:,.0f}/s end to end, {n / steady:,.0f}/s "
          "predicting", flush=True)
    for w in WORKERS:
        wall, predicting = run_job(export_dir, inputs, os.path.join(scratch, model, f"out{w}"),
                                   home, w, f"{model}_w{w}")
        result[f"job_{w}"] = {"wall_s": round(wall, 2), "end_to_end": n / wall,
                              "predicting": n / predicting}
        print(f"{model}: job with {w} workers {n / wall:,.0f}/s end to end, "
              f"{n / predicting:,.0f}/s predicting", flush=True)
    one_worker = result["job_1"]["predicting"]
    result["scaling"] = {str(w): round(result[f"job_{w}"]["predicting"] / one_worker, 2)
                         for w in WORKERS}
    # the goal: N workers on N cores against one worker on one core
    wall, predicting = run_job(export_dir, inputs, os.path.join(scratch, model, "out1c"),
                               home, 1, f"{model}_w1_core1", cores=1)
    result["job_1_on_1_core"] = {"wall_s": round(wall, 2), "end_to_end": n / wall,
                                 "predicting": n / predicting}
    cores = len(os.sched_getaffinity(0))
    result["scaling_per_core"] = {
        str(w): round(result[f"job_{w}"]["predicting"] / (n / predicting), 2)
        for w in WORKERS if w <= cores}
    print(f"{model}: job with 1 worker on 1 core {n / predicting:,.0f}/s predicting; "
          f"N workers on N cores: {result['scaling_per_core']}", flush=True)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["cnn", "tabular"],
                        choices=["cnn", "tabular"])
    parser.add_argument("--cnn-instances", type=int, default=6000)
    parser.add_argument("--tabular-instances", type=int, default=60000)
    parser.add_argument("--seconds", type=float, default=3.0, help="The floor's loop.")
    parser.add_argument("--note", default="", help="Recorded with the results (e.g. the "
                                                   "machine's load).")
    args = parser.parse_args(argv)
    load_before = common.load_average()
    scratch = tempfile.mkdtemp(prefix="batch-predict-bench-")
    try:
        results = {m: bench_model(m, args.cnn_instances if m == "cnn"
                                  else args.tabular_instances, args.seconds, scratch)
                   for m in args.models}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    common.write_json("batch_predict", {"note": args.note, "results": results},
                      load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
