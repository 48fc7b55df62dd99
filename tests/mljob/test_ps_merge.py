"""What the ps adds of two workers' local steps, on changes known in advance.

A real ParameterServerStrategy cluster (one ps and two workers as in-process gRPC
servers, in a child process) trains a one-weight-per-input linear model whose loss is its
output, with Adam at beta_1 = beta_2 = 0: every local step then moves each weight by
exactly -learning_rate, whatever moments the worker read from the ps. After S steps in
all, whichever worker ran which function and in whatever order, the weights are
-S * lr * share: share 1/sqrt(2) for the default rule (the sum of the workers' changes
over sqrt(N)), 1/2 for `ps_merge="mean"`, where a plain sum of the changes gives 1."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tests.support.common import ROOT, free_ports

STEPS, LEARNING_RATE = 21, 0.01

CLUSTER_RUN = r'''
import json, os, sys
import mljob.training as training
from mljob import cluster
import keras
import numpy as np
import tensorflow as tf

ports, job_dir, merge, steps, lr, cosine = json.loads(sys.argv[1])
spec = {"chief": [f"127.0.0.1:{ports[0]}"], "ps": [f"127.0.0.1:{ports[1]}"],
        "worker": [f"127.0.0.1:{p}" for p in ports[2:]]}
# The three servers share this process's one TensorFlow compute pool, sized by the first
# server's config (the cores by default: 2 here). Both workers' first chunks run at once
# (the chief schedules the second before the first step's line) and each holds pool
# threads while it waits on the ps: separate replicas have a pool each; give these room.
pool = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=8)
servers = [tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job, task_index=i,
                                protocol="grpc", start=True, config=pool)
           for job, i in [("ps", 0)] + [("worker", k) for k in range(len(ports) - 2)]]
info = cluster.parse_tf_config(json.dumps({"cluster": spec,
                                           "task": {"type": "chief", "index": 0}}))


def model_fn():
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(
        1, use_bias=False, kernel_initializer="zeros")])


def data(context):  # every example is (1, 1, 1): the loss's gradient is 1 a weight
    return tf.data.Dataset.from_tensors(
        (tf.ones([context.batch_size, 3]), tf.zeros([context.batch_size, 1]))).repeat()


config = training.RunConfig(job_dir=job_dir, train_steps=steps, batch_size=4,
                            steps_per_execution=10, eval_every=0, checkpoint_every=0,
                            log_every=10, ps_merge=merge or None)
status = training.fit(model_fn, data, loss=lambda labels, outputs: outputs[:, 0],
                      optimizer=lambda: keras.optimizers.Adam(
                          keras.optimizers.schedules.CosineDecay(lr, steps) if cosine
                          else lr, beta_1=0.0, beta_2=0.0, epsilon=1e-12), config=config,
                      info=info)
reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(job_dir + "/checkpoints"))
kernel = [reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
          if k.startswith("model/") and "kernel" in k]
print("RESULT", json.dumps({"status": status, "kernel": np.ravel(kernel).tolist()}),
      flush=True)
os._exit(0)  # in-process servers never stop
'''


def _cluster_run(tmp_path, workers: int, merge: str, cosine: bool = False):
    args = json.dumps([free_ports(2 + workers), str(tmp_path / "job"), merge, STEPS,
                       LEARNING_RATE, cosine])
    done = subprocess.run([sys.executable, "-c", CLUSTER_RUN, args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          start_new_session=True)
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and result, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads(result[0][len("RESULT "):])
    assert out["status"] == 0
    return out, done


@pytest.mark.parametrize("merge, share", [
    ("", 1 / math.sqrt(2)), pytest.param("mean", 0.5, marks=pytest.mark.slow)],
    ids=["default sqrt", "mean"])
def test_two_workers_changes_are_merged_by_the_rule(tmp_path, merge, share):
    out, done = _cluster_run(tmp_path, 2, merge)
    rule = "summed / sqrt(2)" if not merge else "averaged"
    assert f"2 workers: weight changes {rule}" in done.stdout + done.stderr
    # bfloat16 on the wire rounds each change by under 0.4%
    want = -STEPS * LEARNING_RATE * share
    assert len(out["kernel"]) == 3
    for weight in out["kernel"]:
        assert weight == pytest.approx(want, rel=0.01), (out, want)


def test_local_steps_take_a_schedule_step_by_step(tmp_path):
    """With a learning-rate schedule each local step takes its own step's rate (the
    schedule of Adam's step count), not the rate its function started at: one worker's
    21 steps in functions of 10, 10 and 1 move each weight by the sum of the cosine's 21
    rates (11.0 lr), where the functions' first rates give 15.4 lr and rates one step
    late 10.0 lr."""
    out, _ = _cluster_run(tmp_path, 1, "", cosine=True)
    want = -sum(LEARNING_RATE * (1 + math.cos(math.pi * i / STEPS)) / 2
                for i in range(STEPS))
    assert len(out["kernel"]) == 3
    for weight in out["kernel"]:
        assert weight == pytest.approx(want, rel=0.01), (out, want)
