"""The equivalence suite's parameter-server runs, in a process of their own (`python -m
tests.mljob.equivalence_ps OUT.json WORKERS`): a real ParameterServerStrategy over
gRPC on 127.0.0.1 (the ps and the workers are mljob's own ps/worker replicas, a process
each; this process is the chief), mljob's loop (`Replica`) scheduling the steps.

Runs, each written as JSON for tests/mljob/test_equivalence_ps.py:
- `one_worker`: one worker, local steps off, SGD+momentum with a BatchNormalization
  model (an L2-regularized output behind a Dropout), against the same model on one
  node: equal;
- `local_steps`: one worker, plain Adam with local steps (the default), against one
  node: equal (the same training, one read and one write a function); the same with
  `class_weight` (`class_weight`, against `single_class_weight`; `unweighted` shows
  that the weights change what is trained);
- `clipnorm`: two workers, Adam(0.05, clipnorm=1e-9) on y = x.[1,2,3,4] (clipping keeps
  the loss where it starts, as on one node), and the same without clipping;
- `two_workers`: two workers, Adam with a BatchNormalization model and a cosine
  schedule: the optimizer's step count, the moving statistics and the loss, against
  one node.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import mljob.training  # noqa: F401
import tensorflow as tf

import keras
import numpy as np

from mljob.training.config import Program, RunConfig
from mljob.training.loop import Replica
from mljob.training.strategies import weights_numpy
from tests.support.common import free_ports

N, BATCH = 64, 8


def _data():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(N, 4)).astype("float32")
    return x, x @ np.array([[1.], [2.], [3.], [4.]], "float32")


def _dataset(batch):
    return tf.data.Dataset.from_tensor_slices(_data()).batch(
        batch, drop_remainder=True).repeat()


def _model_fn(optimizer, batchnorm: bool, regularized: bool = False):
    def build():
        keras.utils.set_random_seed(3)
        inputs = keras.Input((4,), name="x")
        hidden = inputs
        if batchnorm:
            hidden = keras.layers.Dense(8, activation="relu", name="hidden")(hidden)
            hidden = keras.layers.BatchNormalization(name="bn")(hidden)  # momentum 0.99
        if regularized:  # with a Dropout, whose seed is state the ps holds
            hidden = keras.layers.Dropout(0.0, name="drop")(hidden)
        model = keras.Model(inputs, keras.layers.Dense(
            1, name="out", kernel_regularizer=keras.regularizers.L2(0.5) if regularized
            else None)(hidden))
        model.compile(optimizer=optimizer(), loss="mse")
        return model
    return build


CLASS_WEIGHT = {0: 0.2, 1: 3.0, 2: 1.0}



def _classes(batch):
    x, _ = _data()
    y = np.argmax(x[:, :3], axis=1).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).repeat()


def _classifier_fn():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((4,), name="x")
    model = keras.Model(inputs, keras.layers.Dense(3, name="out")(inputs))
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _train(strategy, coordinator, model_fn, steps, workers=1, class_weight=None,
           **config):
    data = _classes if model_fn is _classifier_fn else _dataset
    program = Program(model_fn=model_fn, train_dataset_fn=lambda ctx: data(ctx.batch_size),
                      class_weight=class_weight)
    run = RunConfig(job_dir="unused", train_steps=steps, batch_size=BATCH,
                    steps_per_execution=config.pop("steps_per_execution", 4), **config)
    replica = Replica(strategy, coordinator, program, run, num_workers=workers)
    replica.start_input(program.train_dataset_fn, seed=0)
    done, handles = 0, []
    while done < steps:
        num = min(run.steps_per_execution, steps - done)
        handles.append(replica.run_chunk(num))
        done += num
    replica.sync()
    loss, _ = replica.result(handles[-2:])
    x, y = _data()
    with strategy.scope() if coordinator is not None else _null():
        final = float(np.mean((np.asarray(replica.model(x, training=False))[:, :1] - y)
                              ** 2))
    bn = [w for w in replica.model.weights if "moving_variance" in w.path]
    return {"weights": [w.tolist() for w in weights_numpy(replica.model)],
            "optimizer": [np.asarray(v.numpy()).tolist() for v in replica.optimizer.variables],
            "iterations": int(np.asarray(replica.optimizer.iterations.numpy())),
            "moving_variance": np.concatenate([np.asarray(w.numpy()) for w in bn]).tolist()
            if bn else [], "loss": loss, "final_mse": final,
            "local_steps": bool(replica.local_steps)}


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _cluster(workers: int, procs: list):
    """A ps and `workers` workers, each a process of its own (mljob's own ps/worker
    replica: `python -m mljob.training` style, `servers.serve`), this process the chief."""
    ports = free_ports(2 + workers)
    spec = {"chief": [f"127.0.0.1:{ports[0]}"], "ps": [f"127.0.0.1:{ports[1]}"],
            "worker": [f"127.0.0.1:{p}" for p in ports[2:]]}
    for job in ("ps", "worker"):
        for i in range(len(spec[job])):
            env = dict(os.environ, TF_CONFIG=json.dumps(
                {"cluster": spec, "task": {"type": job, "index": i}}))
            procs.append(subprocess.Popen(
                [sys.executable, "-c", "from mljob import training; "
                 "raise SystemExit(training.serve_if_server())"], env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for address in spec["ps"] + spec["worker"]:
        _wait_listening(address)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    return strategy, tf.distribute.coordinator.ClusterCoordinator(strategy)


def _wait_listening(address: str, timeout: float = 120.0) -> None:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main(argv: list[str]) -> int:
    """OUT.json WORKERS: the runs of a cluster of 1 or 2 workers (one cluster a
    process: a process connects to one cluster) and their one-node references."""
    out, workers = argv[0], int(argv[1])
    single = tf.distribute.get_strategy()
    momentum = lambda: keras.optimizers.SGD(0.02, momentum=0.9)  # noqa: E731
    adam = lambda: keras.optimizers.Adam(0.01)  # noqa: E731
    clipped = lambda: keras.optimizers.Adam(0.05, clipnorm=1e-9)  # noqa: E731
    cosine = lambda: keras.optimizers.Adam(  # noqa: E731
        keras.optimizers.schedules.CosineDecay(0.01, 200))
    results: dict = {}
    procs: list = []
    status = 0
    try:
        _runs(results, workers, procs, single, momentum, adam, clipped, cosine)
    except Exception:
        traceback.print_exc()
        status = 1
    finally:
        stop_replicas(procs)
    end_run(out, results, status)


def stop_replicas(procs) -> None:
    """Stop every replica a run started, by its PID."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def end_run(out: str, results: dict, status: int) -> None:
    """Write the results and end the process at once: the coordinator's threads would
    keep the interpreter waiting."""
    with open(out, "w") as f:
        json.dump(results, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _runs(results, workers, procs, single, momentum, adam, clipped, cosine) -> None:
    if workers == 1:
        # Regularized, with a layer's state: the regularizers' loss is in every step.
        results["single_momentum_bn"] = _train(single, None,
                                               _model_fn(momentum, True, True), 24)
        results["single_adam"] = _train(single, None, _model_fn(adam, False, True), 24)
        strategy, coordinator = _cluster(1, procs)
        results["one_worker"] = _train(strategy, coordinator,
                                       _model_fn(momentum, True, True), 24)
        results["local_steps"] = _train(strategy, coordinator, _model_fn(adam, False, True),
                                        24, ps_wire_dtype="float32")
        results["unregularized"] = _train(single, None, _model_fn(adam, False), 24)
        results["single_class_weight"] = _train(single, None, _classifier_fn, 24,
                                                class_weight=CLASS_WEIGHT)
        results["class_weight"] = _train(strategy, coordinator, _classifier_fn, 24,
                                         class_weight=CLASS_WEIGHT, ps_wire_dtype="float32")
        results["unweighted"] = _train(single, None, _classifier_fn, 24)

    else:
        results["single_clip"] = _train(single, None, _model_fn(clipped, False), 100)
        results["single_cosine_bn"] = _train(single, None, _model_fn(cosine, True), 200)
        strategy, coordinator = _cluster(2, procs)
        results["clipnorm"] = _train(strategy, coordinator, _model_fn(clipped, False), 100,
                                     workers=2)
        results["unclipped"] = _train(strategy, coordinator, _model_fn(
            lambda: keras.optimizers.Adam(0.05), False), 100, workers=2)
        results["two_workers"] = _train(strategy, coordinator, _model_fn(cosine, True), 200,
                                        workers=2, steps_per_execution=2,
                                        ps_local_steps=False)
        results["two_workers_local"] = _train(strategy, coordinator, _model_fn(cosine, True),
                                              200, workers=2, steps_per_execution=2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
