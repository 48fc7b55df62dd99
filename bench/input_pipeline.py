"""The input pipeline's share of a parameter-server worker's CPU: one worker's shard of
the training data (of 2), batch 100, drained inside a `tf.function` as a scheduled
function drains it, with no model. Two pipelines side by side: the trainer's (one
shuffled permutation of the shard's indices an epoch, cut into batches, one gather and
one float conversion a batch) and the one it replaced (tf.data's shuffle, repeat and
batch of single indices, then the same gather), in fresh processes each.

    python -m bench.input_pipeline

Reported: examples/s and process CPU-µs per example, with TensorFlow's default thread
pools and with one intra-op thread (what the local runner gives replicas sharing 2
cores). Writes bench/results/input_pipeline.json.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from bench import common

BATCH, SHARDS = 100, 2


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def per_index_dataset(images, labels, seed: int = 1):
    """The pipeline before: tf.data shuffles and batches single indices."""
    import tensorflow as tf

    from trainer import data
    all_images, all_labels = tf.constant(images), tf.constant(labels, dtype=tf.int64)
    ds = tf.data.Dataset.range(len(labels)).shard(SHARDS, 0)
    ds = ds.shuffle(-(-len(labels) // SHARDS), seed=seed, reshuffle_each_iteration=True)
    ds = ds.repeat().batch(BATCH, drop_remainder=True)
    ds = ds.map(lambda idx: data._to_float_batch(tf.gather(all_images, idx),
                                                 tf.gather(all_labels, idx)),
                num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def measure(batches: int, pipeline: str) -> dict:
    import tensorflow as tf

    from trainer import data
    d = data.load(None)
    if pipeline == "trainer":
        ds = data.train_dataset(d.train_images, d.train_labels, BATCH, shard_index=0,
                                num_shards=SHARDS, seed=1)
    else:
        ds = per_index_dataset(d.train_images, d.train_labels)
    iterator = iter(ds)

    @tf.function
    def drain(n):
        total = tf.constant(0.0)
        for _ in tf.range(n):
            images, _labels = next(iterator)
            total += images[0, 0]  # depend on every batch, as a step does
        return total

    drain(tf.constant(200))  # trace, fill the prefetch buffer
    cpu, wall = _cpu_s(), time.perf_counter()
    drain(tf.constant(batches)).numpy()
    cpu, wall = _cpu_s() - cpu, time.perf_counter() - wall
    examples = batches * BATCH
    return {"batches": batches, "examples_per_s": round(examples / wall),
            "cpu_us_per_example": round(cpu / examples * 1e6, 3)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.input_pipeline", allow_abbrev=False)
    p.add_argument("--batches", type=int, default=5000)
    args = p.parse_args(argv)
    load_before = common.load_average()
    runs = []
    for threads, env in (("default threads", {}), ("one intra-op thread",
                                                   {"TF_NUM_INTRAOP_THREADS": "1"})):
        for pipeline in ("trainer", "per-index shuffle (before)"):
            # A process each: TensorFlow reads its thread settings once, when it starts.
            out = subprocess.run(
                [sys.executable, "-c", "import json; from bench.input_pipeline import "
                 f"measure; print(json.dumps(measure({args.batches}, {pipeline!r})))"],
                env={**os.environ, **env}, capture_output=True, text=True, check=True,
                timeout=600, cwd=common.ROOT)
            run = {"pipeline": pipeline, "threads": threads,
                   **json.loads(out.stdout.strip().splitlines()[-1])}
            runs.append(run)
            print(run)
    common.write_json("input_pipeline", {"batch_size": BATCH, "shards": SHARDS,
                                         "runs": runs}, load_before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
