"""The equivalence suite: mljob's step is Keras's step, distributed.

Modelled on Keras's own distribution correctness tests (tf-keras's
keras/distribute/keras_correctness_test_base.py): each row of the matrix
(tests/mljob/equivalence_models.py: six optimizers with each of their options, layers'
regularisation losses, sample weights, class weights, loss weights on two outputs,
BatchNormalization, keras.io's custom `train_step` models, a GAN with two optimizers, a
VAE with `add_loss`) is trained a few steps from the same seed on the same data by
Keras's `fit` and by mljob's loop, on one node and under a MirroredStrategy of two
replicas (the synchronous path MultiWorkerMirroredStrategy takes), and compared variable
by variable:

- one node against Keras's `fit`: equal to 1e-5;
- two replicas against Keras's `fit` under the same strategy: equal to 1e-5;
- two replicas against one node at the global batch: equal to 1e-4, except where Keras
  itself is not (an optimizer's clipping applies to each replica's gradients in Keras 3,
  as it does in `fit`; BatchNormalization's batch statistics are each replica's);
- where Keras's fit cannot run a row under two replicas (EMA, gradient accumulation),
  mljob refuses it before training, in one line.

The default run trains a part of the matrix; the slow step trains all of it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.support.common import ROOT

pytest.importorskip("tensorflow")

# The default run's rows: one per kind of thing a step must do as Keras does it.
FAST = ["sgd-none", "adam-clipnorm", "regularized", "class_weight", "custom_train_step",
        "lower_level"]
# Where Keras's own fit under two replicas differs from one node (see the module doc).
PER_REPLICA = ("clipnorm", "clipvalue", "global_clipnorm", "batchnorm")
# Options Keras's fit cannot run under synchronous replicas (a merge_call in a tf.cond).
SYNCHRONOUS_REFUSED = ("use_ema", "gradient_accumulation_steps")


def train_rows(rows: list[str], tmp_path, processes: int = 1) -> dict:
    """Every row trained in `processes` processes at once (a row's time is mostly
    tracing, one core's work), each stopped by its PID if the test ends first."""
    parts = [rows[i::processes] for i in range(processes) if rows[i::processes]]
    outs = [tmp_path / f"runs{i}.json" for i in range(len(parts))]
    logs = [tmp_path / f"runs{i}.log" for i in range(len(parts))]
    procs = []
    for out, log, part in zip(outs, logs, parts, strict=True):
        with open(log, "wb") as sink:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tests.mljob.equivalence_runs", str(out), *part],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=sink,
                env={**os.environ, "PYTHONPATH": str(ROOT)}))
    try:
        for proc, log in zip(procs, logs, strict=True):
            proc.wait(timeout=1500)
            assert proc.returncode == 0, log.read_text(errors="replace")[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results: dict = {}
    for out in outs:
        results.update(json.loads(out.read_text()))
    return results


def largest_difference(a, b) -> float:
    assert not isinstance(a, dict), a["error"]
    assert not isinstance(b, dict), b["error"]
    assert len(a) == len(b)
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in
               zip(a, b, strict=True))


def check_row(row: str, runs: dict) -> None:
    from tests.mljob import equivalence_models as zoo
    got = runs[row]
    assert largest_difference(got["single"], got["fit"]) <= 1e-5, \
        f"{row}: one node is not Keras's fit"
    if zoo.ROWS[row]["options"] in SYNCHRONOUS_REFUSED:
        # Keras's fit fails on them under two replicas; mljob refuses them, in a line.
        assert got["fit_mirrored"]["error"].startswith("RuntimeError"), got["fit_mirrored"]
        assert got["mirrored"]["error"].startswith("UsageError: "), got["mirrored"]
        assert "cannot run under 2 synchronous replicas" in got["mirrored"]["error"]
        return
    if zoo.ROWS[row].get("keras_distributes", True):
        assert largest_difference(got["mirrored"], got["fit_mirrored"]) <= 1e-5, \
            f"{row}: two replicas are not Keras's fit under the same strategy"
    else:
        assert not isinstance(got["mirrored"], dict), got["mirrored"]
    if not any(part in row for part in PER_REPLICA):
        assert largest_difference(got["mirrored"], got["single"]) <= 1e-4, \
            f"{row}: two replicas are not one node at the global batch"


@pytest.fixture(scope="module")
def fast_runs(tmp_path_factory) -> dict:
    return train_rows([*FAST, "metrics"], tmp_path_factory.mktemp("equivalence"))


@pytest.mark.parametrize("mode", ["single", "mirrored"])
def test_reported_metrics_are_keras_evaluate_of_every_chunk_and_replica(fast_runs, mode):
    """Three one-step chunks of a model that does not move (learning rate 0), on one
    node and on two replicas: the line's loss, accuracy, AUC and true-positive count
    are Keras's evaluate of the same 24 examples; a count from the last chunk only, or
    averaged over the replicas, is a third or a half of it."""
    keras_says = fast_runs["metrics"]["keras"]
    reported = fast_runs["metrics"][mode]
    assert keras_says["tp"] > 3
    for name in ("loss", "accuracy", "tp", "auc"):
        assert reported[name] == pytest.approx(keras_says[name], rel=1e-5, abs=1e-6), name


@pytest.mark.parametrize("row", FAST)
def test_a_step_is_keras_s_step_on_one_node_and_two_replicas(fast_runs, row):
    check_row(row, fast_runs)


def test_a_model_s_own_train_step_runs_every_step(fast_runs):
    """keras.io's custom train_step moves a counter only it knows of: after six steps
    it is 6 in every mode (it stayed 0 when mljob ran its own step instead)."""
    from tests.mljob import equivalence_models as zoo
    from tests.mljob.equivalence_models import STEPS
    names = _weight_names(zoo.model_fn("custom_train_step"))
    at = names.index("steps_run")
    for mode in ("fit", "single", "mirrored"):
        assert fast_runs["custom_train_step"][mode][at] == STEPS, mode


def _weight_names(model_fn) -> list[str]:
    return [w.path.rsplit("/", 1)[-1] for w in model_fn().weights]


@pytest.mark.slow
def test_the_whole_matrix(tmp_path):
    from tests.mljob import equivalence_models as zoo
    rows = [row for row in zoo.ROWS if row not in FAST]
    runs = train_rows(rows, tmp_path, processes=2)  # the slow step runs one test at a time
    failed = []
    for row in rows:
        try:
            check_row(row, runs)
        except AssertionError as exc:
            failed.append(f"{row}: {str(exc).splitlines()[0]}")
    assert not failed, "\n".join(failed)


# Rows trained under a real MultiWorkerMirroredStrategy: two processes over gRPC.
MULTIWORKER = ["sgd-none", "regularized", "two_outputs", "custom_train_step", "vae_add_loss"]


@pytest.mark.slow
def test_multiworker_two_processes_train_as_one_node(reaper, tmp_path):
    from tests.support.common import free_ports
    from tests.support.trainer_runs import cluster, read, start, tf_config, wait_exit
    out = tmp_path / "multiworker.json"
    spec = cluster(free_ports(2), workers=1, ps=0)
    args = ["--multiworker", str(out), *MULTIWORKER]
    worker = start(reaper, tmp_path / "w0.log", args, module="tests.mljob.equivalence_runs",
                   tf_config=tf_config(spec, "worker"))
    chief = start(reaper, tmp_path / "chief.log", args, module="tests.mljob.equivalence_runs",
                  tf_config=tf_config(spec, "chief"))
    assert wait_exit(chief, 900, tmp_path / "chief.log") == 0, read(tmp_path / "chief.log")[-3000:]
    assert wait_exit(worker, 120, tmp_path / "w0.log") == 0, read(tmp_path / "w0.log")[-3000:]
    runs = json.loads(out.read_text())
    for row in MULTIWORKER:
        assert largest_difference(runs[row]["multiworker"], runs[row]["single"]) <= 1e-4, row
