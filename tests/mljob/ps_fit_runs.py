"""Keras's `fit` on one node against `mljob.fitting.ps_fit.fit` under real parameter
servers, in a process of its own (`python -m tests.mljob.ps_fit_runs OUT.json`): a ps
and one worker (mljob's own ps/worker replicas over gRPC on 127.0.0.1,
tests/mljob/equivalence_ps.py's cluster), this process the chief.

Each run trains the same model from the same seed on the same data for 4 epochs of 6
steps, with callbacks that change training (`LearningRateScheduler` on every epoch's
start, `ReduceLROnPlateau` on `val_loss` at every epoch's end) and validation data:
SGD (the ps step one step at a time) and Adam (local steps). Written as JSON: the
weights, the History, the learning rate each epoch ended with. And `BackupAndRestore`:
a run stopped after its second epoch, fit again, resumes at the third, on one node and
under ps alike. And `fit` on NumPy arrays as keras.io writes it (`y`, `batch_size`,
`validation_split`, no `steps_per_epoch`; `class_weight`), `shuffle=False` on both
sides so that one worker reads the examples in Keras's order.

`python -m tests.mljob.ps_fit_runs OUT.json --library`: the SGD run as the library
call's epoch mode (`training.fit(..., epochs=...)`) on a cluster of its own, every role
running that call (this process the chief, a ps and a worker that serve).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import mljob.training  # noqa: F401
import tensorflow as tf

import keras
import numpy as np

from mljob.fitting import ps_fit
from tests.mljob.equivalence_ps import _cluster, end_run, stop_replicas

EPOCHS, STEPS, BATCH = 4, 6, 8


def data():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(48, 4)).astype("float32")
    return x, np.tanh(x @ np.array([[1.], [-2.], [0.5], [1.5]], "float32"))


def train_dataset():
    return tf.data.Dataset.from_tensor_slices(data()).batch(BATCH, drop_remainder=True) \
        .repeat()


def validation_dataset():
    x, y = data()
    return tf.data.Dataset.from_tensor_slices((x[:16] * 0.5, y[:16])).batch(BATCH)


def build(optimizer):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=optimizer(), loss="mse", metrics=["mae"])
    return model


class LearningRates(keras.callbacks.Callback):
    """The rate each epoch ended with (after ReduceLROnPlateau)."""

    def __init__(self):
        super().__init__()
        self.rates: list[float] = []

    def on_epoch_end(self, epoch, logs=None):
        self.rates.append(float(np.asarray(self.model.optimizer.learning_rate)))


def callbacks():
    rates = LearningRates()
    # ReduceLROnPlateau after LearningRates in the list, so the rate recorded is the
    # epoch's; min_delta so large that every epoch after the first counts as a plateau.
    return rates, [keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.8),
                   rates,
                   keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5,
                                                     patience=0, min_delta=1e9,
                                                     min_lr=1e-6)]


def run(model, fit) -> dict:
    rates, cbs = callbacks()
    history = fit(model, train_dataset(), epochs=EPOCHS, steps_per_epoch=STEPS,
                  validation_data=validation_dataset(), callbacks=cbs, verbose=0)
    return {"weights": [np.asarray(w).tolist() for w in model.get_weights()],
            "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
            "epochs": list(history.epoch), "rates": rates.rates,
            "iterations": int(np.asarray(model.optimizer.iterations))}


class Preempted(Exception):
    pass


class _StopAfter(keras.callbacks.Callback):
    """A preemption at the end of epoch 1 (after BackupAndRestore saved it)."""

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise Preempted()


def resumed(build_model, fit, backup: str) -> dict:
    """Trained with BackupAndRestore, stopped after epoch 1, then fit again from scratch
    as a resubmitted job would: it resumes at epoch 2 with the backed-up state."""
    try:
        fit(build_model(), train_dataset(), epochs=EPOCHS, steps_per_epoch=STEPS,
            callbacks=[keras.callbacks.BackupAndRestore(backup), _StopAfter()], verbose=0)
    except Preempted:
        pass
    model = build_model()
    history = fit(model, train_dataset(), epochs=EPOCHS, steps_per_epoch=STEPS,
                  callbacks=[keras.callbacks.BackupAndRestore(backup)], verbose=0)
    return {"weights": [np.asarray(w).tolist() for w in model.get_weights()],
            "epochs": list(history.epoch),
            "iterations": int(np.asarray(model.optimizer.iterations))}


def siamese_run(model, fit) -> dict:
    """keras.io's Siamese network with its contrastive loss ((batch,) labels against
    (batch, 1) outputs, BatchNormalization, RMSprop): 2 epochs of 4 steps."""
    from tests.mljob import keras_io_models as zoo
    history = fit(model, zoo.siamese_dataset(16).repeat(), epochs=2, steps_per_epoch=4,
                  validation_data=zoo.siamese_dataset(16), verbose=0)
    return {"weights": [np.asarray(w).tolist() for w in model.get_weights()],
            "history": {k: [float(v) for v in vs] for k, vs in history.history.items()}}


def array_data():
    """50 examples: validation_split=0.25 keeps the first 37 (5 batches of 8 an epoch,
    the last of 5) and evaluates the last 13."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(50, 4))  # float64, as NumPy makes it: Keras casts to floatx
    y = np.tanh(x @ np.array([[1.], [-2.], [0.5], [1.5]]))
    return x, y


def classes_data():
    rng = np.random.default_rng(11)
    x = rng.normal(size=(60, 6)).astype("float32")
    return x, np.argmax(x[:, :3], axis=1)


def build_classifier():
    """keras.io's guide's model, smaller: a softmax over classes, RMSprop."""
    keras.utils.set_random_seed(4)
    inputs = keras.Input(shape=(6,), name="digits")
    hidden = keras.layers.Dense(8, activation="relu", name="dense_1")(inputs)
    outputs = keras.layers.Dense(3, activation="softmax", name="predictions")(hidden)
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer="rmsprop", loss="sparse_categorical_crossentropy",
                  metrics=["sparse_categorical_accuracy"])
    return model


def arrays_run(model, fit) -> dict:
    """fit on NumPy arrays as keras.io writes it: y, batch_size, validation_split (no
    steps_per_epoch: Keras's ceil(37 / 8) = 5), with `run`'s callbacks."""
    rates, cbs = callbacks()
    x, y = array_data()
    history = fit(model, x, y=y, batch_size=8, epochs=3, validation_split=0.25,
                  callbacks=cbs, verbose=0)
    return {"weights": [np.asarray(w).tolist() for w in model.get_weights()],
            "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
            "epochs": list(history.epoch), "rates": rates.rates,
            "iterations": int(np.asarray(model.optimizer.iterations))}


def arrays_steps_run(model, fit) -> dict:
    """A steps_per_epoch of 3 against a pass of 5 batches: Keras's epochs end where a
    pass ends (3, 2, then 3 steps)."""
    x, y = array_data()
    history = fit(model, x, y=y, batch_size=8, steps_per_epoch=3, epochs=3,
                  validation_split=0.25, verbose=0)
    return {"weights": [np.asarray(w).tolist() for w in model.get_weights()],
            "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
            "iterations": int(np.asarray(model.optimizer.iterations))}


def class_weight_run(model, fit) -> dict:
    """Arrays with class_weight, Keras's default batch size (32: batches of 32 and 16
    of the 48 kept) and validation_split=0.2."""
    x, y = classes_data()
    history = fit(model, x, y=y, epochs=2, validation_split=0.2,
                  class_weight={0: 0.5, 1: 2.0, 2: 1.0}, verbose=0)
    return {"weights": [np.asarray(w).tolist() for w in model.get_weights()],
            "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
            "iterations": int(np.asarray(model.optimizer.iterations))}


def library(job: str):
    """`training.fit(..., epochs=...)`, the library call's epoch mode, with `run`'s
    model, data and callbacks; every role of the cluster TF_CONFIG names runs it (the
    ps and the worker serve and return 0)."""
    from mljob import training
    rates, cbs = callbacks()
    result = training.fit(
        lambda: build(lambda: keras.optimizers.SGD(0.1, momentum=0.5)),
        lambda context: train_dataset(), config=training.RunConfig(job_dir=job,
                                                                    batch_size=BATCH),
        epochs=EPOCHS, steps_per_epoch=STEPS, validation_data=validation_dataset,
        callbacks=cbs)
    return result, rates


def library_main(out: str) -> int:
    """The library call under ps: a ps and a worker (this module again, with their
    TF_CONFIG) and this process the chief; SGD, as `run`'s `sgd`."""
    from mljob.procs import free_ports
    ports = free_ports(3)
    spec = {"chief": [f"127.0.0.1:{ports[0]}"], "ps": [f"127.0.0.1:{ports[1]}"],
            "worker": [f"127.0.0.1:{ports[2]}"]}
    procs, results, status = [], {}, 0
    try:
        for job in ("ps", "worker"):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tests.mljob.ps_fit_runs", out, "--serve"],
                env=dict(os.environ, TF_CONFIG=json.dumps(
                    {"cluster": spec, "task": {"type": job, "index": 0}})),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        os.environ["TF_CONFIG"] = json.dumps({"cluster": spec,
                                              "task": {"type": "chief", "index": 0}})
        history, rates = library(f"{out}.job")
        model = history.model
        results["library_sgd"] = {
            "weights": [np.asarray(w).tolist() for w in model.get_weights()],
            "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
            "epochs": list(history.epoch), "rates": rates.rates,
            "iterations": int(np.asarray(model.optimizer.iterations))}
    except Exception:
        traceback.print_exc()
        status = 1
    finally:
        stop_replicas(procs)
    end_run(out, results, status)


def main(argv: list[str]) -> int:
    out = argv[0]
    if argv[1:] == ["--serve"]:  # a ps or worker of library_main's cluster
        return library(f"{out}.job")[0]
    if argv[1:] == ["--library"]:
        return library_main(out)
    optimizers = {"sgd": lambda: keras.optimizers.SGD(0.1, momentum=0.5),
                  "adam": lambda: keras.optimizers.Adam(0.02)}
    results: dict = {}
    procs: list = []
    status = 0
    try:
        for name, optimizer in optimizers.items():
            results[f"fit_{name}"] = run(build(optimizer), lambda m, x, **kw: m.fit(
                x, shuffle=False, **kw))
        from tests.mljob import keras_io_models as zoo
        results["fit_siamese"] = siamese_run(zoo.siamese(), lambda m, x, **kw: m.fit(
            x, shuffle=False, **kw))
        results["fit_arrays"] = arrays_run(build(optimizers["sgd"]), lambda m, x, **kw:
                                           m.fit(x, shuffle=False, **kw))
        results["fit_arrays_steps"] = arrays_steps_run(
            build(optimizers["sgd"]), lambda m, x, **kw: m.fit(x, shuffle=False, **kw))
        results["fit_class_weight"] = class_weight_run(
            build_classifier(), lambda m, x, **kw: m.fit(x, shuffle=False, **kw))
        results["fit_backup"] = resumed(lambda: build(optimizers["adam"]), lambda m, x, **kw:
                                        m.fit(x, shuffle=False, **kw), f"{out}.fit-backup")
        strategy, _ = _cluster(1, procs)
        for name, optimizer in optimizers.items():
            with strategy.scope():
                model = build(optimizer)
            results[f"ps_{name}"] = run(model, lambda m, x, **kw: ps_fit.fit(
                m, strategy, x=x, **kw))

        with strategy.scope():
            siamese = zoo.siamese()
        results["ps_siamese"] = siamese_run(siamese, lambda m, x, **kw: ps_fit.fit(
            m, strategy, x=x, **kw))

        with strategy.scope():
            model = build(optimizers["sgd"])
        results["ps_arrays"] = arrays_run(model, lambda m, x, **kw: ps_fit.fit(
            m, strategy, x=x, shuffle=False, **kw))
        with strategy.scope():
            model = build(optimizers["sgd"])
        results["ps_arrays_steps"] = arrays_steps_run(model, lambda m, x, **kw: ps_fit.fit(
            m, strategy, x=x, shuffle=False, **kw))
        with strategy.scope():
            model = build_classifier()
        results["ps_class_weight"] = class_weight_run(model, lambda m, x, **kw: ps_fit.fit(
            m, strategy, x=x, shuffle=False, **kw))

        def in_scope():
            with strategy.scope():
                return build(optimizers["adam"])
        results["ps_backup"] = resumed(in_scope, lambda m, x, **kw: ps_fit.fit(
            m, strategy, x=x, **kw), f"{out}.ps-backup")
    except Exception:
        traceback.print_exc()
        status = 1
    finally:
        stop_replicas(procs)
    end_run(out, results, status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
