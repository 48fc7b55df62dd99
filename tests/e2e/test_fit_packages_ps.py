"""Users' `model.fit` scripts as packages under chief + 2 workers + 1 ps
(tests/support/fit_packages_ps.py): TensorFlow's "Parameter server training" tutorial's
`model.fit` part, and keras.io's timeseries classifier with its callbacks (its strategy
from TF_CONFIG, so the same script also runs on a chief and a worker and on one node). Each job
SUCCEEDS and leaves on the chief what `fit` leaves: the History, a checkpoint by epoch
(or the best one), TensorBoard's epoch scalars, the CSV rows; `EarlyStopping` stops
the run at its epoch."""
from __future__ import annotations

import csv
import json
import os

import pytest

from mljob.procs import pid_alive
from submit import jobs as records
from tests.support.fit_packages_ps import CONFIG_PS, write_fit_package
from tests.support.submit_cli import run as submit_in_process

pytestmark = pytest.mark.slow
pytest.importorskip("tensorflow")


CONFIGS = {  # the replicas each configuration gives the job
    "ps": (CONFIG_PS, ["master-replica-0", "ps-replica-0", "worker-replica-0",
                       "worker-replica-1"]),
    "chief_and_worker": ("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
                         "  workerType: standard\n  workerCount: 1\n",
                         ["master-replica-0", "worker-replica-0"]),
    "basic": ("trainingInput:\n  scaleTier: BASIC\n", ["master-replica-0"]),
}


def _submit(capsys, tmp_path, monkeypatch, name: str, *args, where: str = "ps"):
    config, replicas = CONFIGS[where]
    monkeypatch.chdir(write_fit_package(str(tmp_path / "project"), name, config))
    job_dir = tmp_path / "job"
    status, out, err = submit_in_process(
        capsys, f"{name}01", "--package-path", name + "job", "--module-name",
        f"{name}job.task", "--job-dir", str(job_dir), "--config=config.yaml", "--", *args)
    assert status == 0, err + out[-4000:]
    record = records.load(f"{name}01")
    assert record.state == records.SUCCEEDED, out[-4000:]
    assert sorted(r.label for r in record.replicas) == replicas
    for replica in record.replicas:  # nothing of the job is left
        assert replica.pid and not pid_alive(replica.pid), replica.label
    return job_dir, out


def _epoch_scalars(folder) -> dict[str, list[int]]:
    """{tag: [steps]} of the scalars in the event files under `folder`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    found: dict[str, list[int]] = {}
    for dirpath, _, names in os.walk(folder):
        if not any(n.startswith("events.out.tfevents") for n in names):
            continue
        events = EventAccumulator(dirpath, size_guidance={"tensors": 0, "scalars": 0})
        events.Reload()
        for tag in events.Tags().get("tensors", []) + events.Tags().get("scalars", []):
            items = events.Tensors(tag) if tag in events.Tags().get("tensors", []) \
                else events.Scalars(tag)
            found.setdefault(tag, []).extend(e.step for e in items)
    return found


def test_the_parameter_server_tutorial_s_fit_runs_with_its_callbacks(
        capsys, tmp_path, monkeypatch):
    job_dir, out = _submit(capsys, tmp_path, monkeypatch, "pstutorial", "--epochs", "3")
    history = json.loads((job_dir / "history.json").read_text())
    assert history["epoch"] == [0, 1, 2] and len(history["history"]["loss"]) == 3
    # ModelCheckpoint: one a epoch; TensorBoard: the epoch scalars under train/.
    assert sorted(os.listdir(job_dir / "ckpt")) == [f"epoch-0{i}.keras" for i in (1, 2, 3)]
    scalars = _epoch_scalars(job_dir / "log" / "train")
    assert sorted(scalars["epoch_loss"]) == [0, 1, 2]
    # BackupAndRestore removes its backup once training ends, as Keras's does.
    assert not os.path.exists(job_dir / "backup" / "training_metadata.json")
    assert "worker-replica-1\tworker 1: server.join()" in out


@pytest.mark.parametrize("where", ["ps", "chief_and_worker", "basic"])
def test_a_keras_io_example_s_callbacks_run_on_the_chief_and_early_stopping_stops_it(
        capsys, tmp_path, monkeypatch, where):
    job_dir, out = _submit(capsys, tmp_path, monkeypatch, "timeseries", where=where)
    history = json.loads((job_dir / "history.json").read_text())
    # EarlyStopping (patience 2, no epoch improving by min_delta) stopped 20 epochs at 3.
    assert history["epoch"] == [0, 1, 2]
    assert "Epoch 3: early stopping" in out
    assert {"loss", "sparse_categorical_accuracy", "val_loss",
            "val_sparse_categorical_accuracy", "learning_rate"} <= set(history["history"])
    with open(job_dir / "training.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
    assert [float(r["val_loss"]) for r in rows] == pytest.approx(
        history["history"]["val_loss"], rel=1e-5)
    assert (job_dir / "best_model.keras").stat().st_size > 0
    # TensorBoard as Keras writes it: train/ and validation/ epoch scalars by epoch.
    assert sorted(_epoch_scalars(job_dir / "logs" / "train")["epoch_loss"]) == [0, 1, 2]
    assert sorted(_epoch_scalars(job_dir / "logs" / "validation")["epoch_loss"]) == [
        0, 1, 2]
