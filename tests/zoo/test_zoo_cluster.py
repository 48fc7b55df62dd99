"""Zoo models trained as real clusters on 127.0.0.1 (`python -m tests.zoo.models NAME`
under TF_CONFIG): ParameterServerStrategy (chief, 2 workers, 1 ps; 2 ps for the
embedding that is sharded) and MultiWorkerMirroredStrategy (2 replicas). For each: the
export's predictions equal the trained model's (the final checkpoint's weights in
model_fn's model), the reported evaluation equals Keras's `evaluate` with those
weights, and what the model holds (BatchNormalization's moving statistics, a custom
layer's running mean, lookup tables) was trained under the strategy and exported.

A few steps on tiny data: what is checked is that the states travel, not accuracy.
"""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from tests.support.common import free_ports
from tests.support.trainer_runs import cluster, lines, read, start, tf_config, wait_exit
from tests.zoo import models as zoo
from tests.zoo.test_zoo import (EVAL_N, _predictable, eval_features, export_predictions,
                                reported_eval, trained_model)

pytestmark = pytest.mark.slow
tf = pytest.importorskip("tensorflow")
TIMEOUT = 300
STEPS = 30

# These zoo entries make Keras metric objects before training.main, which starts
# TensorFlow before MultiWorkerMirroredStrategy can configure its collectives: under
# multiworker they get the one-line error (test below); every other pair trains.
METRIC_OBJECTS = ("regression", "multilabel", "imbalanced")
RUNS = [(kind, name) for kind in ("ps", "multiworker") for name in zoo.ZOO
        if not (kind == "multiworker" and name in METRIC_OBJECTS)]


def _train(reaper, tmp_path, kind: str, name: str) -> str:
    job = str(tmp_path / "job")
    args = [name, "--job-dir", job, "--train-steps", str(STEPS)]
    entry = zoo.ZOO[name]

    def go(role, spec, task, index=0):
        return start(reaper, tmp_path / f"{role}.log", args, module="tests.zoo.models",
                     tf_config=tf_config(spec, task, index))
    if kind == "ps":
        spec = cluster(free_ports(3 + entry.ps), workers=2, ps=entry.ps)
        servers = [go(f"ps{i}", spec, "ps", i) for i in range(entry.ps)]
        servers += [go(f"w{i}", spec, "worker", i) for i in range(2)]
        chief = go("chief", spec, "chief")
        assert wait_exit(chief, TIMEOUT, tmp_path / "chief.log") == 0, \
            read(tmp_path / "chief.log")[-4000:]
        for proc in servers:
            proc.send_signal(signal.SIGTERM)
            wait_exit(proc, 60)
    else:
        spec = cluster(free_ports(2), workers=1, ps=0)
        worker = go("w0", spec, "worker")
        chief = go("chief", spec, "chief")
        assert wait_exit(chief, TIMEOUT, tmp_path / "chief.log") == 0, \
            read(tmp_path / "chief.log")[-4000:]
        assert wait_exit(worker, 60, tmp_path / "w0.log") == 0, read(tmp_path / "w0.log")
    started = lines(tmp_path / "chief.log", "training started:")[0]
    assert f"strategy={kind} " in started and " replicas=2 " in started, started
    return job


@pytest.mark.parametrize("kind, name", RUNS, ids=[f"{k}_{n}" for k, n in RUNS])
def test_cluster_trains_exports_and_reports_as_keras(reaper, tmp_path, kind, name):
    entry = zoo.ZOO[name]
    job = _train(reaper, tmp_path, kind, name)
    if kind == "ps" and entry.ps == 2:  # the embedding was split over both ps
        assert any("items/embeddings=2" in line
                   for line in lines(tmp_path / "chief.log", "variables: "))
    model = trained_model(entry, job)
    raw = eval_features(entry)
    expected = model.predict(_predictable(raw), batch_size=64, verbose=0)
    got = export_predictions(job, zoo.as_inputs(entry, raw))
    if isinstance(expected, dict):
        for key, want in expected.items():
            np.testing.assert_allclose(got[key], want, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_allclose(got["outputs"], expected, rtol=1e-5, atol=1e-5)
    keras_says = entry.reference(trained_model(entry, job)).evaluate(
        zoo.dataset(entry, EVAL_N, 1, 64), verbose=0, return_dict=True)
    reported = reported_eval(job)
    for metric, value in keras_says.items():
        assert reported[metric] == pytest.approx(float(value), rel=1e-4, abs=1e-5), \
            (metric, reported, keras_says)
    if name == "image":  # BatchNormalization's moving statistics trained under it
        bn = model.get_layer("bn")
        assert np.abs(np.asarray(bn.moving_mean)).max() > 1e-3
        assert np.abs(np.asarray(bn.moving_variance) - 1).max() > 1e-3
    if name == "subclassed":  # the custom layer's state, trained on the workers
        state = {v.path.split("/")[-1]: np.asarray(v) for v in model.weights}
        assert state["batches_seen"] > 0
        assert np.abs(state["running_mean"] - 2).max() < 1.5
    # The training lines' metrics are Keras's names, from the merged states.
    last = lines(tmp_path / "chief.log", f"step {STEPS}/{STEPS} ")[0]
    for metric in keras_says:
        assert f" {metric}=" in last, last
    assert not os.path.exists(os.path.join(job, "model.tmp"))


def test_metric_objects_made_before_main_are_one_line_under_multiworker(reaper, tmp_path):
    args = ["regression", "--job-dir", str(tmp_path / "job"), "--train-steps", str(STEPS)]
    spec = cluster(free_ports(2), workers=1, ps=0)
    procs = [start(reaper, tmp_path / f"{role}.log", args, module="tests.zoo.models",
                   tf_config=tf_config(spec, role, 0)) for role in ("worker", "chief")]
    for proc, role in zip(procs, ("worker", "chief"), strict=True):
        assert wait_exit(proc, TIMEOUT, tmp_path / f"{role}.log") == 2
        text = read(tmp_path / f"{role}.log")
        assert "TensorFlow already ran in this process before MultiWorkerMirroredStrategy" \
            in text and "pass metrics as names" in text \
            and "or return a model compiled" in text, text
        assert "Traceback" not in text and "program startup" not in text, text
        # told before waiting for peers: the worker never waits for a chief that failed
        assert "waiting for the chief" not in text, text
