"""`mljob.training.fit(..., epochs=N)`, the library call's epoch mode, on one node in
this process: Keras's own `fit` (the same History, weights and callback calls as
`model.fit` on the same model, data and seed), with what the library gives a job added
after the user's callbacks (the progress lines, the summaries' tags, the per-epoch
checkpoints, the export, the resume of a stopped job at its epoch), and the refusals."""
from __future__ import annotations

import csv
import json
import os
import re

import numpy as np
import pytest

pytest.importorskip("tensorflow")

EPOCHS, STEPS, BATCH = 3, 6, 32


def _arrays():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype("float32")
    return x, (x[:, :3].sum(axis=1) > 0).astype("float32")


def train_dataset_fn(context):
    import tensorflow as tf
    x, y = _arrays()
    return tf.data.Dataset.from_tensor_slices((x[:384], y[:384])).batch(
        context.batch_size, drop_remainder=True).repeat()


def validation():
    import tensorflow as tf
    x, y = _arrays()
    return tf.data.Dataset.from_tensor_slices((x[384:], y[384:])).batch(BATCH)


def model_fn():
    import keras
    keras.utils.set_random_seed(7)
    inputs = keras.Input((8,), name="x")
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(hidden))


def optimizer():
    import keras
    return keras.optimizers.SGD(0.5, momentum=0.5)


class Calls:
    """A callback of the test's own: every call, with the epoch logs and the rate."""

    def __new__(cls):
        import keras

        class Recorder(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.calls: list = []

            def on_train_begin(self, logs=None):
                self.calls.append(("train_begin",))

            def on_epoch_begin(self, epoch, logs=None):
                self.calls.append(("epoch_begin", epoch))

            def on_train_batch_end(self, batch, logs=None):
                self.calls.append(("batch_end", batch))

            def on_test_begin(self, logs=None):
                self.calls.append(("test_begin",))

            def on_epoch_end(self, epoch, logs=None):
                self.calls.append(("epoch_end", epoch, sorted(logs),
                                   float(self.model.optimizer.learning_rate.numpy())))

            def on_train_end(self, logs=None):
                self.calls.append(("train_end",))
        return Recorder()


def _callbacks(csv_path):
    import keras
    return [keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.9),
            keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=0,
                                              min_delta=1e9),
            keras.callbacks.CSVLogger(str(csv_path)), Calls()]


def _library(tmp_path, job, callbacks, **overrides):
    from mljob import cluster, training
    kwargs = dict(loss="binary_crossentropy", optimizer=optimizer, metrics=["accuracy"],
                  config=training.RunConfig(job_dir=str(job), batch_size=BATCH),
                  info=cluster.from_environment({}), epochs=EPOCHS, steps_per_epoch=STEPS,
                  validation_data=validation(), callbacks=callbacks)
    kwargs.update(overrides)
    return training.fit(kwargs.pop("model_fn", model_fn), train_dataset_fn, **kwargs)


def _csv(path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_epoch_mode_is_keras_fit_with_the_jobs_outputs_added(tmp_path, capsys):
    import tensorflow as tf

    from mljob import training
    from mljob.training.loop import InputContext

    reference = model_fn()
    reference.compile(optimizer=optimizer(), loss="binary_crossentropy",
                      metrics=["accuracy"])
    theirs = _callbacks(tmp_path / "fit.csv")
    expected = reference.fit(train_dataset_fn(InputContext(global_batch_size=BATCH, seed=0)),
                             epochs=EPOCHS, steps_per_epoch=STEPS,
                             validation_data=validation(), callbacks=theirs, verbose=0)
    capsys.readouterr()

    job = tmp_path / "job"
    ours = _callbacks(tmp_path / "lib.csv")
    history = _library(tmp_path, job, ours, serving=training.Serving())
    out = capsys.readouterr().out

    # Keras's History, weights, the callbacks' calls and effects, the CSV rows: fit's
    assert history.epoch == expected.epoch == [0, 1, 2]
    assert set(history.history) == set(expected.history) == {
        "loss", "accuracy", "val_loss", "val_accuracy", "learning_rate"}
    for key, values in expected.history.items():
        assert history.history[key] == pytest.approx(values, rel=1e-5, abs=1e-7), key
    for a, b in zip(history.model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert ours[-1].calls == theirs[-1].calls
    assert ours[-1].calls.count(("test_begin",)) == EPOCHS
    assert [c[3] for c in ours[-1].calls if c[0] == "epoch_end"] == pytest.approx(
        [0.45, 0.2025, 0.091125])  # the scheduler, then the plateau's halvings
    rows, fit_rows = _csv(tmp_path / "lib.csv"), _csv(tmp_path / "fit.csv")
    assert [r["epoch"] for r in rows] == ["0", "1", "2"]
    for row, fit_row in zip(rows, fit_rows, strict=True):
        assert {k: float(v) for k, v in row.items()} == pytest.approx(
            {k: float(v) for k, v in fit_row.items()}, rel=1e-5)

    # the job's lines, with M = epochs * steps_per_epoch
    lines = out.splitlines()
    assert lines[0].startswith("training started: strategy=single epoch=0 epochs=3 "
                               "steps_per_epoch=6 step=0 train_steps=18 ")
    steps = [line for line in lines if line.startswith("step ")]
    assert [re.match(r"step (\d+)/18 loss=", s).group(1) for s in steps] == ["6", "12", "18"]
    # each epoch's line: its loss and metrics as History has them, the rate it trained at
    assert [s.rsplit(" ", 1)[1] for s in steps] == ["lr=0.45", "lr=0.405", "lr=0.18225"]
    assert f"accuracy={history.history['accuracy'][1]:.4f}" in steps[1]
    evals = [line for line in lines if line.startswith("eval step=")]
    assert [line.split()[1] for line in evals] == ["step=6", "step=12", "step=18"]
    assert f"loss={history.history['val_loss'][-1]:.4f}" in evals[-1]
    assert any(line.startswith("training finished: step=18 epochs=3 loss=") for line in lines)
    assert lines[-1] == f"exported model to {job / 'model'}"

    # the summaries' tags, read as the console reads them
    from submit.query import curves
    series = curves.of_job("job", str(job))
    assert sorted(series["metrics/loss"]) == ["eval", "train"]
    assert sorted(series["metrics/loss"]["train"]) == [6, 12, 18]
    assert series["metrics/accuracy"]["eval"][18] == \
        pytest.approx(history.history["val_accuracy"][-1], rel=1e-5)
    assert "optimizer/learning_rate" in series
    # the per-epoch checkpoints an evaluator follows, the backup, the export
    assert tf.train.latest_checkpoint(str(job / "checkpoints")).endswith("ckpt-18")
    assert os.path.isdir(job / "checkpoints" / "backup")
    assert os.path.exists(job / "model" / "saved_model.pb")

    # run again, the finished job trains no more
    again = _library(tmp_path, job, [], serving=training.Serving())
    assert again.epoch == []
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "training finished: step=18 already_done=true",
        f"model already exported at {job / 'model'}"]

    # an evaluator replica follows those checkpoints to the last epoch's, and returns 0
    from mljob import cluster
    evaluator = cluster.from_environment({"TF_CONFIG": json.dumps({
        "cluster": {"chief": ["127.0.0.1:1"]}, "task": {"type": "evaluator", "index": 0}})})
    capsys.readouterr()
    assert _library(tmp_path, job, [], info=evaluator) == 0
    out = capsys.readouterr().out
    assert f"eval step=18 loss={history.history['val_loss'][-1]:.4f}" in out
    assert "evaluator finished: step=18" in out


def test_a_tuning_trial_gets_each_validation_else_the_last_epochs_logs(tmp_path,
                                                                       monkeypatch):
    from mljob import hypertune
    metrics = tmp_path / "hypertune" / "output.metrics"
    for name, value in (("CLOUD_ML_TRIAL_ID", "3"), ("CLOUD_ML_HP_METRIC_FILE", str(metrics)),
                        ("CLOUD_ML_HP_METRIC_TAG", "val_accuracy")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(hypertune, "_trial_writer", None)
    history = _library(tmp_path, tmp_path / "job", [], epochs=2)
    reports = hypertune.read_reports(str(metrics), "val_accuracy")
    assert [r.step for r in reports] == [6, 12]
    assert [r.value for r in reports] == pytest.approx(history.history["val_accuracy"])

    monkeypatch.setenv("CLOUD_ML_HP_METRIC_TAG", "accuracy")
    monkeypatch.setenv("CLOUD_ML_HP_METRIC_FILE", str(metrics) + "-2")
    monkeypatch.setattr(hypertune, "_trial_writer", None)
    history = _library(tmp_path, tmp_path / "job2", [], epochs=2, validation_data=None)
    reports = hypertune.read_reports(str(metrics) + "-2", "accuracy")
    assert [(r.step, r.value) for r in reports] == [
        (12, pytest.approx(history.history["accuracy"][-1]))]


def test_class_weight_weighs_the_epochs_as_in_keras_fit(tmp_path):
    from mljob.training.loop import InputContext
    weights = {0: 1.0, 1: 4.0}
    reference = model_fn()
    reference.compile(optimizer=optimizer(), loss="binary_crossentropy")
    reference.fit(train_dataset_fn(InputContext(global_batch_size=BATCH, seed=0)), epochs=2,
                  steps_per_epoch=STEPS, class_weight=weights, verbose=0)
    history = _library(tmp_path, tmp_path / "job", [], epochs=2, metrics=None,
                       validation_data=None, class_weight=weights)
    for a, b in zip(history.model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    unweighted = _library(tmp_path, tmp_path / "job2", [], epochs=2, metrics=None,
                          validation_data=None)
    assert not np.allclose(unweighted.model.get_weights()[-1], reference.get_weights()[-1])


def _stop_after_epoch(stop, epoch: int):
    """A callback that delivers SIGTERM to the run's stop flag at `epoch`'s end, as the
    signal handler would."""
    import signal

    import keras

    class Terminate(keras.callbacks.Callback):
        def on_epoch_end(self, e, logs=None):
            if e == epoch:
                stop.signum = signal.SIGTERM
    return Terminate()


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_stopped_job_exits_143_after_its_backup_and_resumes_at_its_epoch(tmp_path, capsys,
                                                                          where):
    import uuid

    from mljob import storage
    from mljob.training import Preempted, StopSignal

    # An epoch of 12 steps is one pass over the 384 examples: a resumed fit reads its
    # dataset from the start again (as Keras's does), which is where it would be anyway.
    passes = {"steps_per_epoch": 12}
    whole = _library(tmp_path, tmp_path / "whole", [], **passes)
    # no watchdog exit in this process: the run answers the stop itself
    stop = StopSignal({"MLJOB_STOP_DEADLINE": "1e9"})
    # remote: an fsspec URL TensorFlow cannot write (the backup goes through a local
    # folder, uploaded each epoch)
    job = tmp_path / "job" if where == "local" else f"memory://job-{uuid.uuid4().hex}"
    with pytest.raises(Preempted, match=r"stopped after epoch 1 \(got SIGTERM\); backup "
                                        r"saved, run again to resume") as stopped:
        _library(tmp_path, job, [_stop_after_epoch(stop, 0)], stop=stop, **passes)
    assert stopped.value.exit_status == 143
    capsys.readouterr()
    assert storage.exists(f"{job}/checkpoints/backup/training_metadata.json")
    resumed = _library(tmp_path, job, [], **passes)
    out = capsys.readouterr().out
    assert resumed.epoch == [1, 2]
    assert "training started: strategy=single epoch=1 epochs=3 steps_per_epoch=12 " \
        "step=12 " in out
    assert resumed.history["val_loss"] == pytest.approx(whole.history["val_loss"][1:],
                                                        rel=1e-5)
    for a, b in zip(resumed.model.get_weights(), whole.model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert int(resumed.model.optimizer.iterations.numpy()) == EPOCHS * 12


@pytest.mark.parametrize("overrides, fragment", [
    ({"steps_per_epoch": None}, "epochs needs steps_per_epoch"),
    ({"epochs": 0}, "epochs must be an integer of at least 1"),
    ({"validation_data": None, "validation_steps": 2},
     "validation_steps without validation_data"),
    ({"eval_dataset_fn": validation}, "validation_data and eval_dataset_fn are the same"),
    ({"initial_epoch": 3}, "initial_epoch 3 leaves no epoch to run"),
    ({"callbacks": [print]}, "callbacks holds a builtin_function_or_method, not a"),
    ({"epochs": None}, "steps_per_epoch belongs to the epoch mode: give epochs=N"),
    ({"config": "train_steps"}, "RunConfig.train_steps is the step mode's"),
    ({"validation_data": (np.zeros((4, 8)), np.zeros(4))},
     "validation_data is a tuple: give a finite tf.data.Dataset"),
    ({"epochs": None, "steps_per_epoch": None, "validation_data": [1, 2]},
     "validation_data is a list: give a finite tf.data.Dataset"),
], ids=["no steps_per_epoch", "epochs 0", "validation_steps alone", "both validations",
        "initial_epoch", "not a callback", "no epochs", "train_steps", "arrays",
        "step mode"])
def test_epoch_mode_refusals_name_the_fix(tmp_path, overrides, fragment):
    from mljob import training
    if overrides.get("config") == "train_steps":
        overrides["config"] = training.RunConfig(job_dir=str(tmp_path / "job"),
                                                 train_steps=50)
    with pytest.raises(training.UsageError, match=re.escape(fragment)):
        _library(tmp_path, tmp_path / "job", overrides.pop("callbacks", []), **overrides)
    assert not os.path.exists(tmp_path / "job")


MAIN_SCRIPT = '''\
import os, sys, time
import keras
from mljob import training
from tests.mljob.test_training_epochs import model_fn, optimizer, train_dataset_fn


class Slow(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        time.sleep(float(os.environ.get("EPOCH_SECONDS", "0")))


training.main(model_fn, train_dataset_fn, loss="binary_crossentropy", optimizer=optimizer,
              config=training.RunConfig(job_dir=sys.argv[1], batch_size=32), epochs=30,
              steps_per_epoch=2, callbacks=[Slow()])
'''


@pytest.mark.slow  # two TensorFlow processes
def test_main_sigterm_exits_143_after_the_epoch_and_the_job_resumes_there(tmp_path):
    import signal
    import subprocess
    import sys

    from mljob.procs import stop_process
    from tests.support.common import ROOT
    script, job = tmp_path / "task.py", tmp_path / "job"
    script.write_text(MAIN_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CONFIG": ""}
    proc = subprocess.Popen([sys.executable, str(script), str(job)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**env, "EPOCH_SECONDS": "0.5"})
    try:
        for line in proc.stdout:
            if line.startswith("step "):
                proc.send_signal(signal.SIGTERM)
                break
        _, err = proc.communicate(timeout=300)
    finally:
        stop_process(proc)
    assert proc.returncode == 143, err[-3000:]
    stopped = re.search(r"^error: stopped after epoch (\d+) \(got SIGTERM\); backup saved, "
                        r"run again to resume$", err, re.M)
    assert stopped, err[-3000:]
    done = subprocess.run([sys.executable, str(script), str(job)], cwd=ROOT, text=True,
                          capture_output=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]  # main: a History is exit status 0
    epoch = int(stopped.group(1))
    assert f"training started: strategy=single epoch={epoch} epochs=30 steps_per_epoch=2 " \
        f"step={2 * epoch} " in done.stdout
    assert "training finished: step=60 epochs=30" in done.stdout
