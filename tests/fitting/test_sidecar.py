"""Sidecar evaluation of a `model.fit` script (mljob/fitting/sidecar.py): where the
epochs are published, the chief's publisher (each epoch's weights, then the index; the
two newest kept; `final` at the end), the evaluator following them (Keras's `evaluate`
of the newest epoch, equal to the chief's model's; its end when the final epoch is
evaluated, when stopped, or at once without validation data), and the evaluator's
strategies and `fit` through the launcher."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mljob import cluster
from tests.support.common import ROOT

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from mljob.fitting import sidecar  # noqa: E402
from mljob.fitting.errors import FitRefused  # noqa: E402


def _tf_config(task: str, **extra) -> dict:
    return {"TF_CONFIG": json.dumps({
        "cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],
                    "ps": ["127.0.0.1:3"], **extra.pop("cluster", {})},
        "task": {"type": task, "index": 0}, **extra})}


@pytest.mark.parametrize("environ, expected", [
    (_tf_config("chief"), False),
    (_tf_config("chief", job={"evaluatorCount": 1}), True),
    (_tf_config("chief", job={"evaluatorCount": "1"}), True),  # int64 as a string
    (_tf_config("chief", job=json.dumps({"evaluatorCount": 2})), True),
    (_tf_config("chief", job={"evaluatorCount": 0}), False),
    (_tf_config("chief", job={"evaluatorCount": "x"}), False),
    (_tf_config("chief", cluster={"evaluator": ["127.0.0.1:4"]}), True),  # Kubeflow's
    (_tf_config("evaluator"), True),
    ({"CLUSTER_SPEC": json.dumps({"cluster": {"workerpool0": ["h:1"], "workerpool1": [
        "h:2"], "workerpool3": ["h:4"]}, "task": {"type": "workerpool0", "index": 0}})},
     True),
    ({"CLUSTER_SPEC": json.dumps({"cluster": {"workerpool0": ["h:1"], "workerpool1": [
        "h:2"]}, "task": {"type": "workerpool0", "index": 0}})}, False),
])
def test_a_job_with_an_evaluator_is_known_from_each_engine_s_environment(environ,
                                                                          expected):
    assert cluster.from_environment(environ).has_evaluator is expected


@pytest.mark.parametrize("environ, args, expected", [
    ({}, ["--job-dir", "/j"], "/j/fit-epochs"),
    ({}, ["--epochs", "3", "--job_dir=gs://b/j"], "gs://b/j/fit-epochs"),
    ({"AIP_CHECKPOINT_DIR": "gs://b/ckpt"}, ["--job-dir", "/j"], "gs://b/ckpt/fit-epochs"),
    ({}, ["--epochs", "3"], None),
    ({}, ["--job-dir"], None),
])
def test_the_epochs_are_published_under_the_checkpoint_dir_or_the_job_dir(environ, args,
                                                                           expected):
    assert sidecar.epochs_url(environ, args) == expected


def _data(seed: int, n: int = 64):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")
    return x, y


def _model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.layers.Dense(8, activation="relu"),
                              keras.layers.BatchNormalization(), keras.layers.Dense(2)])
    model.compile(optimizer="adam", metrics=["sparse_categorical_accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class _Stop:
    """A StopSignal that is never (or at once) requested."""

    def __init__(self, stopped: bool = False):
        self.stopped, self.waits = stopped, 0

    def wait(self, timeout):
        self.waits += 1
        if self.waits > 50:
            raise AssertionError("the evaluator kept waiting after its end")
        return self.stopped

    def reason(self):
        return "got SIGTERM"


@pytest.fixture
def trained(tmp_path):
    """A chief's fit of 4 epochs of 4 steps, published under job `j1`."""
    url = str(tmp_path / "fit-epochs")
    x, y = _data(0)
    model = _model()
    publisher = sidecar.Publisher(url, {"CLOUD_ML_JOB_ID": "j1"})
    model.fit(x, y, batch_size=16, epochs=4, verbose=0, callbacks=[publisher])
    return url, model


def test_the_chief_publishes_each_epoch_and_keeps_the_two_newest(trained):
    url, model = trained
    assert sorted(os.listdir(url)) == ["epoch-00003.npz", "epoch-00004.npz", "latest.json"]
    entry = sidecar.read_index(url, "j1")
    assert entry == {"job": "j1", "epoch": 4, "epochs": 4, "iterations": 16,
                     "final": True, "weights": "epoch-00004.npz"}
    with np.load(os.path.join(url, "epoch-00004.npz")) as saved:
        for i, weight in enumerate(model.get_weights()):
            np.testing.assert_array_equal(saved[f"arr_{i}"], weight)
    assert sidecar.read_index(url, "another-job") is None  # an earlier job's index


def test_the_evaluator_evaluates_the_newest_epoch_as_keras_does_and_ends(trained):
    url, chief = trained
    xv, yv = _data(1)
    said = []
    status = sidecar.follow(_model(), url, {"validation_data": (xv, yv)}, say=said.append,
                            environ={"CLOUD_ML_JOB_ID": "j1"}, poll_seconds=0,
                            stop=_Stop())
    assert status == 0
    expected = chief.evaluate(xv, yv, verbose=0, return_dict=True)
    line = next(s for s in said if s.startswith("evaluator: epoch 4/4 (step 16): "))
    values = dict(kv.split("=") for kv in line.split(": ", 2)[2].split())
    assert float(values["val_loss"]) == pytest.approx(expected["loss"], rel=1e-5)
    assert float(values["val_sparse_categorical_accuracy"]) == pytest.approx(
        expected["sparse_categorical_accuracy"])
    assert said[-1] == "evaluator finished: the chief's last epoch (4) evaluated"


def test_the_evaluator_writes_a_tensorboard_run_beside_the_script_s(trained, tmp_path):
    """And the job's summaries, where the console reads a job's curves."""
    from submit.query.curves import JobCurves
    url, _ = trained
    xv, yv = _data(1)
    logs = tmp_path / "logs"
    job_dir = tmp_path / "job"
    summaries = sidecar.summaries_url({}, ["--job-dir", str(job_dir)])
    arguments = {"x": np.concatenate([_data(2)[0], xv]),
                 "y": np.concatenate([_data(2)[1], yv]), "validation_split": 0.5,
                 "batch_size": 16,
                 "callbacks": [keras.callbacks.TensorBoard(log_dir=str(logs))]}
    sidecar.follow(_model(), url, arguments, summaries=summaries, say=lambda s: None,
                   environ={"CLOUD_ML_JOB_ID": "j1"}, poll_seconds=0, stop=_Stop())
    tags = {}
    folder = logs / sidecar.RUN
    for name in os.listdir(folder):
        for event in tf.compat.v1.train.summary_iterator(str(folder / name)):
            for value in event.summary.value:
                tags[value.tag] = event.step
    assert tags["epoch_loss"] == 3 and tags["evaluation_loss_vs_iterations"] == 16
    curves = JobCurves(str(job_dir)).read()
    assert list(curves["metrics/loss"]["eval"]) == [16]
    assert list(curves["metrics/sparse_categorical_accuracy"]["eval"]) == [16]


@pytest.mark.parametrize("environ, args, expected", [
    ({}, ["--job-dir", "/j"], "/j/summaries"),
    ({"AIP_TENSORBOARD_LOG_DIR": "gs://b/tb/"}, [], "gs://b/tb"),
    ({}, [], None),
])
def test_the_job_s_summaries_are_where_the_trainer_writes_them(environ, args, expected):
    assert sidecar.summaries_url(environ, args) == expected


def test_a_stopped_evaluator_takes_one_last_look_and_ends_with_status_0(tmp_path):
    url = str(tmp_path / "fit-epochs")
    x, y = _data(0)
    model = _model()
    publisher = sidecar.Publisher(url, {})
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[publisher])
    publisher._index(final=False)  # the chief still training
    said = []
    status = sidecar.follow(_model(), url, {"validation_data": _data(1)}, say=said.append,
                            environ={}, poll_seconds=0, stop=_Stop(stopped=True))
    assert status == 0
    assert said[-1] == "evaluator stopping: got SIGTERM; last evaluated epoch 1"


def test_an_evaluator_stopped_before_any_epoch_says_it_evaluated_nothing(tmp_path):
    said = []
    url = str(tmp_path / "fit-epochs")
    assert sidecar.follow(_model(), url, {"validation_data": _data(1)}, say=said.append,
                          environ={}, poll_seconds=0, stop=_Stop(stopped=True)) == 0
    assert said[-1] == (f"evaluator stopping: got SIGTERM; nothing evaluated: the chief "
                        f"published no epoch in {url}")


def test_without_validation_data_the_evaluator_says_so_and_ends(tmp_path):
    said = []
    assert sidecar.follow(_model(), None, {"x": _data(0)[0]}, say=said.append,
                          stop=_Stop()) == 0
    assert len(said) == 1 and "nothing to evaluate" in said[0]


def test_refusals_name_the_fix(trained):
    with pytest.raises(FitRefused, match="give the job --job-dir"):
        sidecar.follow(_model(), None, {"validation_data": _data(1)}, stop=_Stop())
    url, _ = trained
    other = keras.Sequential([keras.layers.Dense(3)])
    other.compile(loss="mse")
    with pytest.raises(FitRefused, match="the same model on every replica"):
        sidecar.follow(other, url, {"validation_data": _data(1)}, say=lambda s: None,
                       environ={"CLOUD_ML_JOB_ID": "j1"}, poll_seconds=0, stop=_Stop())


EVALUATOR_SCRIPT = '''\
import sys
import numpy as np
import tensorflow as tf
import keras
mwms = tf.distribute.MultiWorkerMirroredStrategy()  # TensorFlow's: KeyError 'evaluator'
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
strategy = tf.distribute.ParameterServerStrategy(resolver)  # TensorFlow's: hangs here
print("STRATEGIES", type(strategy).__name__, type(mwms).__name__, flush=True)
with strategy.scope():
    model = keras.Sequential([keras.layers.Dense(2)])
    model.compile(loss="mse")
x = np.ones((8, 3), "float32")
model.fit(x, np.zeros((8, 2), "float32"), epochs=2, validation_data=(x, x[:, :2]))
print("AFTER FIT", flush=True)
'''


def test_on_the_evaluator_the_strategies_are_local_and_fit_evaluates_then_ends(tmp_path):
    """Through the launcher, as every replica runs: TensorFlow's strategies would fail
    (MultiWorkerMirrored) or connect as the chief and wait there (ps); `fit` evaluates
    the published epoch and the replica ends with status 0 before the script's next
    line."""
    job_dir = tmp_path / "job"
    url = str(job_dir / sidecar.FOLDER)
    model = keras.Sequential([keras.layers.Dense(2)])
    model.compile(loss="mse")
    x = np.ones((8, 3), "float32")
    model.fit(x, np.zeros((8, 2), "float32"), epochs=1, verbose=0,
              callbacks=[sidecar.Publisher(url, {"CLOUD_ML_JOB_ID": "j2"})])
    (tmp_path / "evaltask.py").write_text(EVALUATOR_SCRIPT)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}",
           "CLOUD_ML_JOB_ID": "j2", **_tf_config("evaluator", job={"evaluatorCount": 1})}
    env.pop("MLJOB_KERAS_FIT", None)
    ran = subprocess.run([sys.executable, "-m", "mljob.fitting.launch", "evaltask",
                          "--job-dir", str(job_dir)], env=env, capture_output=True,
                         text=True, timeout=240, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "STRATEGIES _DefaultDistributionStrategy _DefaultDistributionStrategy" \
        in ran.stdout
    assert "evaluator: epoch 1/1 (step 1): val_loss=" in ran.stdout
    assert "evaluator finished: the chief's last epoch (1) evaluated" in ran.stdout
    assert "AFTER FIT" not in ran.stdout


def test_a_chief_alone_with_an_evaluator_runs_keras_s_fit_and_publishes(tmp_path):
    """No workers, an evaluator (CUSTOM: a master and evaluatorCount): the launcher's
    patch is on, the chief's fit is Keras's own with the publisher after its callbacks."""
    from mljob import fitting
    environ = {"TF_CONFIG": json.dumps({
        "cluster": {"master": ["127.0.0.1:1"]}, "task": {"type": "master", "index": 0},
        "job": {"evaluatorCount": 1}}), "CLOUD_ML_JOB_ID": "j3"}
    assert fitting.in_cluster(environ)
    assert not fitting.in_cluster({"TF_CONFIG": json.dumps({
        "cluster": {"master": ["127.0.0.1:1"]}, "task": {"type": "master", "index": 0}})})
    fitting.install(environ, ["--job-dir", str(tmp_path)])
    try:
        x, y = _data(0)
        history = _model().fit(x, y, batch_size=16, epochs=2, verbose=0)
    finally:
        fitting.uninstall()
    assert history.epoch == [0, 1]  # Keras's History, as its fit returns it
    entry = sidecar.read_index(str(tmp_path / sidecar.FOLDER), "j3")
    assert entry["epoch"] == 2 and entry["final"] is True
