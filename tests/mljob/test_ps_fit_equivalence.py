"""The equivalence suite for `fit` under parameter servers: Keras's `fit` on one node
against `mljob.fitting.ps_fit.fit` on a real ps and worker over gRPC
(tests/mljob/ps_fit_runs.py), with callbacks that change training
(`LearningRateScheduler`, `ReduceLROnPlateau` on `val_loss`) and validation data:
the same weights, the same History (the epoch's training metrics over every step,
`val_` metrics, the rates the callbacks logged) and the same rates, for SGD with
momentum (the ps step one at a time) and Adam (local steps); and `BackupAndRestore`
resuming a stopped run at its epoch, with the optimizer's state, as on one node; and
`fit` on NumPy arrays with `validation_split` (and `class_weight`), the same split,
batches and steps as Keras's."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.support.common import ROOT

pytestmark = pytest.mark.slow
pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("ps_fit") / "runs.json"
    done = subprocess.run([sys.executable, "-m", "tests.mljob.ps_fit_runs", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def library_runs(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("ps_library") / "runs.json"
    done = subprocess.run([sys.executable, "-m", "tests.mljob.ps_fit_runs", str(out),
                           "--library"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return {**json.loads(out.read_text()), "stdout": done.stdout}


def test_the_library_call_by_epochs_under_ps_is_keras_fit_on_one_node(runs, library_runs):
    ours, keras_fit = library_runs["library_sgd"], runs["fit_sgd"]
    for a, b in zip(ours["weights"], keras_fit["weights"], strict=True):
        assert np.allclose(a, b, atol=1e-5)
    assert ours["epochs"] == keras_fit["epochs"] == [0, 1, 2, 3]
    for key, values in keras_fit["history"].items():
        assert ours["history"][key] == pytest.approx(values, rel=1e-4, abs=1e-6), key
    assert ours["rates"] == pytest.approx(keras_fit["rates"], rel=1e-6)
    assert "training started: strategy=ps epoch=0 epochs=4 steps_per_epoch=6" in \
        library_runs["stdout"]
    assert "training finished: step=24 epochs=4" in library_runs["stdout"]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_fit_under_ps_trains_and_reports_as_keras_fit_on_one_node(runs, optimizer):
    ours, keras_fit = runs[f"ps_{optimizer}"], runs[f"fit_{optimizer}"]
    for a, b in zip(ours["weights"], keras_fit["weights"], strict=True):
        assert np.allclose(a, b, atol=1e-5)
    assert ours["epochs"] == keras_fit["epochs"] == [0, 1, 2, 3]
    assert set(ours["history"]) == set(keras_fit["history"]) == {
        "loss", "mae", "val_loss", "val_mae", "learning_rate"}
    for key, values in keras_fit["history"].items():
        assert ours["history"][key] == pytest.approx(values, rel=1e-4, abs=1e-6), key
    assert ours["rates"] == pytest.approx(keras_fit["rates"], rel=1e-6)
    assert ours["iterations"] == keras_fit["iterations"] == 24


def test_the_callbacks_changed_what_was_trained(runs):
    # The scheduler and the plateau halvings moved the rate: 0.1 -> 0.01024 for SGD.
    assert runs["ps_sgd"]["rates"][0] == pytest.approx(0.08)
    assert runs["ps_sgd"]["rates"][-1] == pytest.approx(0.01024, rel=1e-5)


def test_backup_and_restore_resumes_a_stopped_run_at_its_epoch_as_on_one_node(runs):
    ours, keras_fit = runs["ps_backup"], runs["fit_backup"]
    assert ours["epochs"] == keras_fit["epochs"] == [2, 3]
    assert ours["iterations"] == keras_fit["iterations"] == 24  # the optimizer's state too
    for a, b in zip(ours["weights"], keras_fit["weights"], strict=True):
        assert np.allclose(a, b, atol=1e-5)


def test_keras_io_s_siamese_network_trains_under_ps_as_keras_fit_trains_it(runs):
    # Its contrastive loss takes (batch,) labels against (batch, 1) outputs: called as
    # compile calls it, not broadcast to (batch, batch); BatchNormalization's statistics
    # added on the ps.
    ours, keras_fit = runs["ps_siamese"], runs["fit_siamese"]
    for a, b in zip(ours["weights"], keras_fit["weights"], strict=True):
        assert np.allclose(a, b, atol=1e-5)
    for key, values in keras_fit["history"].items():
        assert ours["history"][key] == pytest.approx(values, rel=1e-4, abs=1e-6), key


def test_fit_on_arrays_with_validation_split_under_ps_is_keras_fit_on_one_node(runs):
    # Keras's split (the last 13 of 50 evaluated), its steps (ceil(37 / 8) = 5, the last
    # batch of 5), floats cast to floatx, val_ logs from the chief's evaluation.
    ours, keras_fit = runs["ps_arrays"], runs["fit_arrays"]
    assert ours["iterations"] == keras_fit["iterations"] == 15
    assert ours["epochs"] == keras_fit["epochs"] == [0, 1, 2]
    assert set(ours["history"]) == set(keras_fit["history"]) == {
        "loss", "mae", "val_loss", "val_mae", "learning_rate"}
    for key, values in keras_fit["history"].items():
        assert ours["history"][key] == pytest.approx(values, rel=1e-4, abs=1e-6), key
    assert ours["rates"] == pytest.approx(keras_fit["rates"], rel=1e-6)
    for a, b in zip(ours["weights"], keras_fit["weights"], strict=True):
        assert np.allclose(a, b, atol=1e-5)


def test_a_steps_per_epoch_across_a_pass_of_arrays_ends_epochs_where_keras_s_do(runs):
    ours, keras_fit = runs["ps_arrays_steps"], runs["fit_arrays_steps"]
    assert ours["iterations"] == keras_fit["iterations"] == 8  # 3 + 2 + 3
    for key, values in keras_fit["history"].items():
        assert ours["history"][key] == pytest.approx(values, rel=1e-4, abs=1e-6), key
    for a, b in zip(ours["weights"], keras_fit["weights"], strict=True):
        assert np.allclose(a, b, atol=1e-5)


def test_class_weight_on_arrays_under_ps_weighs_as_keras_fit_does(runs):
    ours, keras_fit = runs["ps_class_weight"], runs["fit_class_weight"]
    assert ours["iterations"] == keras_fit["iterations"] == 4  # 2 epochs of 32 + 16
    assert set(ours["history"]) == {"loss", "sparse_categorical_accuracy", "val_loss",
                                    "val_sparse_categorical_accuracy"}
    for key, values in keras_fit["history"].items():
        assert ours["history"][key] == pytest.approx(values, rel=1e-4, abs=1e-6), key
    for a, b in zip(ours["weights"], keras_fit["weights"], strict=True):
        assert np.allclose(a, b, atol=1e-5)
