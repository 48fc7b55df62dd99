"""The equivalence suite for `model.fit` itself: Keras's own `fit` on one node against
the same script's `fit` under MultiWorkerMirroredStrategy on two processes (through
mljob's launcher), with callbacks that change training (ReduceLROnPlateau,
LearningRateScheduler): the same learning rates epoch by epoch, the same History, the
same weights."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from mljob.procs import free_ports, stop_process
from tests.support.common import ROOT

SCRIPT = '''\
import json, os, sys
import numpy as np
import tensorflow as tf
import keras

out = sys.argv[1]
cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {})
strategy = tf.distribute.MultiWorkerMirroredStrategy() if cluster.get("worker") \\
    else tf.distribute.get_strategy()
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")
y = (x[:, :3].sum(axis=1) > 0).astype("float32")
train = tf.data.Dataset.from_tensor_slices((x[:384], y[:384])).batch(32)
val = tf.data.Dataset.from_tensor_slices((x[384:], y[384:])).batch(32)
with strategy.scope():
    keras.utils.set_random_seed(7)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(hidden))
    model.compile(optimizer=keras.optimizers.SGD(0.5, momentum=0.5),
                  loss="binary_crossentropy", metrics=["accuracy"])
rates = []
history = model.fit(train, epochs=6, validation_data=val, verbose=0, callbacks=[
    keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.9),
    keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=0,
                                      min_delta=1e-3),
    keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: rates.append(
        float(model.optimizer.learning_rate.numpy()))),
])
np.savez(out, *model.get_weights())
with open(out + ".json", "w") as f:
    json.dump({"history": history.history, "rates": rates}, f)
'''


LIBRARY_SCRIPT = '''\
import json, os, sys, time
import numpy as np
import tensorflow as tf
import keras
from mljob import training

out, job = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")
y = (x[:, :3].sum(axis=1) > 0).astype("float32")


def val():  # a function: no TensorFlow before the strategy configures its collectives
    return tf.data.Dataset.from_tensor_slices((x[384:], y[384:])).batch(32)


def train_dataset_fn(context):
    # each replica's share of every global batch of 32 (context.batch_size of it)
    i, n = context.input_pipeline_id, context.batch_size
    return tf.data.Dataset.from_tensor_slices((x[:384], y[:384])).batch(32).map(
        lambda a, b: (a[i * n:(i + 1) * n], b[i * n:(i + 1) * n])).repeat()


def model_fn():
    keras.utils.set_random_seed(7)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(hidden))


class Rates(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        rates.append(float(self.model.optimizer.learning_rate.numpy()))
        time.sleep(float(os.environ.get("EPOCH_SECONDS") or 0))  # a job to stop


rates = []
history = training.fit(
    model_fn, train_dataset_fn, loss="binary_crossentropy", metrics=["accuracy"],
    optimizer=lambda: keras.optimizers.SGD(0.5, momentum=0.5),
    config=training.RunConfig(job_dir=job, batch_size=32), epochs=6, steps_per_epoch=12,
    validation_data=val, callbacks=[
        keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.9),
        keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=0,
                                          min_delta=1e-3), Rates()])
np.savez(out, *history.model.get_weights())
with open(out + ".json", "w") as f:
    json.dump({"history": history.history, "rates": rates}, f)
'''


def _two_workers(tmp_path, env, *args, status: int = 0, signal_after: str = "") -> None:
    """The script as chief and worker of a MultiWorkerMirrored cluster, each through
    mljob's launcher; `{task}` in args is the task's name. signal_after: SIGTERM both
    once the chief's log has a line starting so."""
    ports = free_ports(2)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    procs, logs = [], []
    try:
        for task in ("chief", "worker"):
            log = open(tmp_path / f"{task}.log", "w")
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "mljob.fitting.launch", "fitscript",
                 *(a.format(task=task) for a in args)], cwd=tmp_path, stdout=log,
                stderr=subprocess.STDOUT,
                env={**env, "TF_CONFIG": json.dumps(
                    {"cluster": cluster, "task": {"type": task, "index": 0}})}))
        deadline = time.monotonic() + 600
        while signal_after and procs[0].poll() is None and time.monotonic() < deadline:
            if any(line.startswith(signal_after) for line in
                   (tmp_path / "chief.log").read_text().splitlines()):
                for proc in procs:
                    proc.send_signal(signal.SIGTERM)
                break
            time.sleep(0.2)
        for proc, task in zip(procs, ("chief", "worker"), strict=True):
            assert proc.wait(timeout=900) == status, \
                (tmp_path / f"{task}.log").read_text()[-3000:]
    finally:
        for proc in procs:
            stop_process(proc)
        for log in logs:
            log.close()


def _assert_same(one: dict, one_weights, two: dict, two_weights) -> None:
    # the callbacks took the same decisions: the same rate after every epoch
    np.testing.assert_allclose(two["rates"], one["rates"], rtol=1e-6)
    for key, values in one["history"].items():
        np.testing.assert_allclose(two["history"][key], values, rtol=1e-4, atol=1e-5,
                                   err_msg=key)
    for name in one_weights.files:
        np.testing.assert_allclose(two_weights[name], one_weights[name], rtol=1e-4,
                                   atol=1e-5)
    assert len(set(one["rates"])) > 2  # both callbacks moved the rate


def _env(tmp_path) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    env.pop("TF_CONFIG", None)
    return env


def _single(tmp_path, env) -> dict:
    script = tmp_path / "fitscript.py"
    script.write_text(SCRIPT)
    single = subprocess.run([sys.executable, str(script), str(tmp_path / "single.npz")],
                            env=env, capture_output=True, text=True, timeout=600)
    assert single.returncode == 0, single.stderr[-3000:]
    return json.loads((tmp_path / "single.npz.json").read_text())


@pytest.mark.slow  # three TensorFlow processes
def test_fit_under_two_workers_is_keras_fit_on_one_node(tmp_path):
    env = _env(tmp_path)
    one = _single(tmp_path, env)
    _two_workers(tmp_path, env, str(tmp_path / "{task}.npz"))
    for task in ("chief", "worker"):
        two = json.loads((tmp_path / f"{task}.npz.json").read_text())
        _assert_same(one, np.load(tmp_path / "single.npz"), two,
                     np.load(tmp_path / f"{task}.npz"))


@pytest.mark.slow  # three TensorFlow processes
def test_the_library_call_by_epochs_under_two_workers_is_keras_fit_on_one_node(tmp_path):
    """training.fit(..., epochs=6) under MultiWorkerMirrored (each replica reading its
    share of every batch from train_dataset_fn) against model.fit on one node."""
    env = _env(tmp_path)
    one = _single(tmp_path, env)
    (tmp_path / "fitscript.py").write_text(LIBRARY_SCRIPT)
    _two_workers(tmp_path, env, str(tmp_path / "{task}.npz"), str(tmp_path / "job"))
    two = json.loads((tmp_path / "chief.npz.json").read_text())
    _assert_same(one, np.load(tmp_path / "single.npz"), two,
                 np.load(tmp_path / "chief.npz"))
    log = (tmp_path / "chief.log").read_text()
    assert "training started: strategy=multiworker epoch=0 epochs=6" in log
    assert "step 72/72 loss=" in log and "training finished: step=72 epochs=6" in log
    worker = (tmp_path / "worker.log").read_text().splitlines()
    assert not [line for line in worker if line.startswith("step ")]  # the chief reports


@pytest.mark.slow  # five TensorFlow processes
def test_the_library_call_stopped_under_two_workers_resumes_at_the_agreed_epoch(tmp_path):
    """SIGTERM during training: both workers stop after the same epoch (its backup
    saved) and exit 143; run again, they resume there and end with one node's weights
    (an epoch is one pass over the data, so restarting the dataset changes nothing)."""
    env = _env(tmp_path)
    _single(tmp_path, env)
    (tmp_path / "fitscript.py").write_text(LIBRARY_SCRIPT)
    args = (str(tmp_path / "{task}.npz"), str(tmp_path / "job"))
    _two_workers(tmp_path, {**env, "EPOCH_SECONDS": "2"}, *args, status=143,
                 signal_after="step 12/72")
    stopped = []
    for task in ("chief", "worker"):
        found = re.findall(r"^error: stopped after epoch (\d) \(", (tmp_path / f"{task}.log")
                           .read_text(), re.M)
        assert len(found) == 1, (tmp_path / f"{task}.log").read_text()[-3000:]
        stopped += found
    assert stopped[0] == stopped[1] != "6"
    _two_workers(tmp_path, env, *args)
    log = (tmp_path / "chief.log").read_text()
    assert f"training started: strategy=multiworker epoch={stopped[0]} epochs=6" in log
    assert "training finished: step=72 epochs=6" in log
    one, two = np.load(tmp_path / "single.npz"), np.load(tmp_path / "chief.npz")
    for name in one.files:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-4, atol=1e-5)
