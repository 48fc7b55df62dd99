"""The equivalence suite for `model.fit` itself: Keras's own `fit` on one node against
the same script's `fit` under MultiWorkerMirroredStrategy on two processes (through
mljob's launcher), with callbacks that change training (ReduceLROnPlateau,
LearningRateScheduler): the same learning rates epoch by epoch, the same History, the
same weights."""
from __future__ import annotations

import json
import os
import subprocess
import sys

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


@pytest.mark.slow  # three TensorFlow processes
def test_fit_under_two_workers_is_keras_fit_on_one_node(tmp_path):
    script = tmp_path / "fitscript.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    env.pop("TF_CONFIG", None)
    single = subprocess.run([sys.executable, str(script), str(tmp_path / "single.npz")],
                            env=env, capture_output=True, text=True, timeout=600)
    assert single.returncode == 0, single.stderr[-3000:]
    ports = free_ports(2)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    procs, logs = [], []
    try:
        for task, out in (("chief", "chief.npz"), ("worker", "worker.npz")):
            log = open(tmp_path / f"{task}.log", "w")
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "mljob.fitting.launch", "fitscript",
                 str(tmp_path / out)], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                env={**env, "TF_CONFIG": json.dumps(
                    {"cluster": cluster, "task": {"type": task, "index": 0}})}))
        for proc, task in zip(procs, ("chief", "worker"), strict=True):
            assert proc.wait(timeout=900) == 0, (tmp_path / f"{task}.log").read_text()[-3000:]
    finally:
        for proc in procs:
            stop_process(proc)
        for log in logs:
            log.close()
    one = json.loads((tmp_path / "single.npz.json").read_text())
    for task in ("chief", "worker"):
        two = json.loads((tmp_path / f"{task}.npz.json").read_text())
        # the callbacks took the same decisions: the same rate after every epoch
        np.testing.assert_allclose(two["rates"], one["rates"], rtol=1e-6)
        for key, values in one["history"].items():
            np.testing.assert_allclose(two["history"][key], values, rtol=1e-4, atol=1e-5,
                                       err_msg=key)
        a, b = np.load(tmp_path / "single.npz"), np.load(tmp_path / f"{task}.npz")
        for name in a.files:
            np.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=1e-5)
    assert len(set(one["rates"])) > 2  # both callbacks moved the rate
