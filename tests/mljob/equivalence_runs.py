"""The equivalence suite's runs, in a process of their own (`python -m
tests.mljob.equivalence_runs OUT.json [ROW ...]`): every row of the matrix trained three
ways on the same data, its weights written as JSON for tests/mljob/test_equivalence.py.

- `fit`: Keras's own `model.fit` on one device, the reference;
- `single`: mljob's loop (`Replica`) on one node, at the same batch;
- `mirrored`: mljob's loop under a MirroredStrategy of 2 replicas (two logical CPUs:
  the synchronous path MultiWorkerMirroredStrategy takes, in one process), at the same
  global batch;
- `fit_mirrored`: Keras's `fit` under the same MirroredStrategy, for the rows whose
  model Keras can distribute (what Keras's own distribution correctness tests compare);
- with `--multiworker OUT.json ROW ...` under TF_CONFIG: a replica of a real
  MultiWorkerMirroredStrategy of two processes on 127.0.0.1 (the chief also trains each
  row on one node and writes both).

Modelled on tf-keras's keras/distribute/keras_correctness_test_base.py: small
deterministic problems, fixed seeds, float32, a few steps.
"""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # the same kernels in every run

import mljob.training  # noqa: F401  (before TensorFlow, as a trainer imports it)
import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from mljob.training.config import Program, RunConfig  # noqa: E402
from mljob.training.loop import Replica  # noqa: E402
from mljob.training.strategies import weights_numpy  # noqa: E402
from tests.mljob import equivalence_models as zoo  # noqa: E402

BATCH, STEPS = zoo.BATCH, zoo.STEPS


def _dataset(row, batch):
    x, y, w = zoo.data(row)
    parts = (x, y) if w is None else (x, y, w)
    return tf.data.Dataset.from_tensor_slices(parts).batch(batch, drop_remainder=True)


def _keras_fit(row, strategy=None) -> list[np.ndarray]:
    keras.utils.set_random_seed(1)
    scope = strategy.scope() if strategy is not None else _null()
    with scope:
        model = zoo.model_fn(row)()
    kwargs = {"class_weight": zoo.ROWS[row].get("class_weight")} \
        if zoo.ROWS[row].get("class_weight") else {}
    model.fit(_dataset(row, BATCH).repeat(), steps_per_epoch=STEPS, epochs=1, verbose=0,
              shuffle=False, **kwargs)
    return [np.asarray(w) for w in model.get_weights()]


def _mljob(row, strategy) -> list[np.ndarray]:
    keras.utils.set_random_seed(1)
    spec = zoo.ROWS[row]
    # Per-replica batches; each input pipeline (one a worker under multiworker) takes
    # its turn, so a step's global batch is the same examples in every mode.
    program = Program(model_fn=zoo.model_fn(row),
                      train_dataset_fn=lambda ctx: _dataset(row, ctx.batch_size).shard(
                          ctx.num_input_pipelines, ctx.input_pipeline_id).repeat(),
                      class_weight=spec.get("class_weight"))
    config = RunConfig(job_dir="unused", train_steps=STEPS, batch_size=BATCH,
                       steps_per_execution=4)
    replica = Replica(strategy, None, program, config)
    replica.start_input(program.train_dataset_fn, seed=0)
    handles = [replica.run_chunk(1), replica.run_chunk(STEPS - 1)]
    replica.result(handles)
    iterations = int(replica.optimizer.iterations.numpy())
    every = replica.optimizer.gradient_accumulation_steps or 1  # Keras counts updates
    assert iterations == STEPS // every, f"{row}: {iterations} optimizer steps, not {STEPS}"
    return weights_numpy(replica.model)


def _binary_data():
    rng = np.random.default_rng(11)
    x = rng.normal(size=(N_METRICS, 4)).astype("float32")
    return x, (x[:, 0] + 0.5 * x[:, 1] > 0).astype("float32")[:, None]


N_METRICS = 3 * BATCH


def _metric_model():
    """A classifier that does not move (learning rate 0): the metrics of its training
    steps are then Keras's evaluate of the same batches."""
    keras.utils.set_random_seed(4)
    inputs = keras.Input((4,), name="x")
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="binary_crossentropy",
                  metrics=["accuracy", keras.metrics.TruePositives(name="tp"),
                           keras.metrics.AUC(name="auc")])
    return model


def _reported_metrics(strategy) -> dict:
    """What mljob's training lines report over three one-step chunks."""
    def dataset_fn(ctx):
        return tf.data.Dataset.from_tensor_slices(_binary_data()).batch(
            ctx.batch_size, drop_remainder=True).shard(
            ctx.num_input_pipelines, ctx.input_pipeline_id).repeat()
    program = Program(model_fn=_metric_model, train_dataset_fn=dataset_fn)
    replica = Replica(strategy, None, program,
                      RunConfig(job_dir="unused", train_steps=3, batch_size=BATCH))
    replica.start_input(dataset_fn, seed=0)
    loss, metrics = replica.result([replica.run_chunk(1) for _ in range(3)])
    return {"loss": loss, **metrics}


def _keras_evaluated() -> dict:
    model = _metric_model()
    x, y = _binary_data()
    return model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def multiworker(out: str, rows: list[str]) -> int:
    """This process's replica of a real MultiWorkerMirroredStrategy of two processes
    (TF_CONFIG): each row trained under it, and on one node by the chief, which writes
    both."""
    from mljob import cluster
    from mljob.training.strategies import make_strategy
    info = cluster.from_environment(os.environ)
    strategy, _ = make_strategy("multiworker", info)
    results: dict = {}
    for row in rows:
        results[row] = {"multiworker": [w.tolist() for w in _mljob(row, strategy)]}
        if info.is_chief:
            results[row]["single"] = [w.tolist() for w in _mljob(
                row, tf.distribute.get_strategy())]
    if info.is_chief:
        with open(out, "w") as f:
            json.dump(results, f)
    return 0


def main(argv: list[str]) -> int:
    if argv[0] == "--multiworker":
        return multiworker(argv[1], argv[2:])
    out, rows = argv[0], argv[1:] or list(zoo.ROWS)
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    results: dict = {}
    if "metrics" in rows:  # what the lines report, against Keras's evaluate
        rows = [r for r in rows if r != "metrics"]
        results["metrics"] = {"keras": _keras_evaluated(),
                              "single": _reported_metrics(tf.distribute.get_strategy()),
                              "mirrored": _reported_metrics(mirrored)}
    for row in rows:
        runs = {"fit": lambda: _keras_fit(row),
                "single": lambda: _mljob(row, tf.distribute.get_strategy()),
                "mirrored": lambda: _mljob(row, mirrored)}
        if zoo.ROWS[row].get("keras_distributes", True):
            runs["fit_mirrored"] = lambda: _keras_fit(row, mirrored)
        entry: dict = {}
        for name, run in runs.items():
            try:
                entry[name] = [w.tolist() for w in run()]
            except Exception as exc:  # recorded: the tests say which must not fail
                entry[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        results[row] = entry
        print(f"trained {row}", file=sys.stderr, flush=True)
    with open(out, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
