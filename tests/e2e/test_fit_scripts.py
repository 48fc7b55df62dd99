"""Users' `model.fit` scripts, unchanged, submitted as packages: on one node Keras's own
fit runs; with a chief and a worker (MultiWorkerMirroredStrategy) mljob's launcher makes
the same `fit` run, with what it leaves on the chief, the callbacks' effects on every
worker, and BackupAndRestore resuming a job killed in the middle of an epoch."""
from __future__ import annotations

import csv
import json
import os
import re

import pytest

from submit import jobs as records
from tests.support.fit_packages import write_callbacks_package, write_tutorial
from tests.support.fit_packages_ps import CONFIG_PS
from tests.support.submit_cli import run as submit

pytestmark = pytest.mark.slow  # TensorFlow replicas, a minute or more each

CHIEF_AND_WORKER = ("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
                    "  workerType: standard\n  workerCount: 1\n")


def config(tmp_path, text: str = CHIEF_AND_WORKER) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def replica_lines(out: str, prefix: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        m = re.search(r"((?:master|worker)-replica-\d)\t(.*)$", line)
        if m and m.group(2).startswith(prefix):
            found.setdefault(m.group(1), []).append(m.group(2))
    return found


def test_the_multi_worker_tutorial_runs_unchanged_on_a_chief_and_a_worker(capsys, tmp_path):
    pkg = write_tutorial(str(tmp_path / "tutorial"))
    status, out, err = submit(capsys, "tut01", "--package-path", pkg, "--module-name",
                              "main", "--job-dir", str(tmp_path / "tut01"), "--config",
                              config(tmp_path))
    assert status == 0, err[-3000:] + out[-3000:]
    assert records.load("tut01").state == records.SUCCEEDED
    assert "PerReplica" not in out + err
    # Keras's own progress lines, epoch by epoch, from the chief
    epochs = [m for m in re.findall(r"master-replica-0\tEpoch (\d)/3", out)]
    assert epochs == ["1", "2", "3"], out[-3000:]
    assert re.search(r"70/70.*accuracy: \d\.\d+ - loss: \d\.\d+", out)


def epoch_scalars(folder: str, tag: str) -> list[float]:
    """TensorBoard's scalars of `tag` in the event files under folder, by step."""
    import tensorflow as tf
    found = {}
    for name in sorted(os.listdir(folder)):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(folder, name)):
            for value in event.summary.value:
                if value.tag == tag:
                    found[event.step] = float(tf.make_ndarray(value.tensor))
    return [found[k] for k in sorted(found)]


def fit_guide(capsys, tmp_path, job_id: str, *args: str, where: str = "chief_and_worker",
              resume: bool = False):
    pkg = write_callbacks_package(str(tmp_path / "guide"))
    configs = {"chief_and_worker": CHIEF_AND_WORKER, "ps": CONFIG_PS}
    extra = ["--config", config(tmp_path, configs[where])] if where in configs else []
    return submit(capsys, job_id, "--package-path", pkg, "--module-name", "fitguide.task",
                  "--job-dir", str(tmp_path / job_id), *extra,
                  *(["--resume"] if resume else []), "--", *args)


@pytest.mark.parametrize("where", ["basic", "chief_and_worker", "ps"])
def test_keras_io_callbacks_leave_on_the_chief_what_fit_leaves(capsys, tmp_path, where):
    """EarlyStopping (that never sees an improvement of 100) stops every worker after
    the third epoch; the chief holds History, a checkpoint per epoch, the CSV rows and
    TensorBoard's epoch scalars. Under parameter servers (chief + 2 workers + 1 ps) the
    guide's fit on arrays with validation_split runs as written: the workers serve in
    server.join(), so the chief alone runs fit and its callbacks, and only it reports."""
    job_dir = tmp_path / "fit01"
    status, out, err = fit_guide(capsys, tmp_path, "fit01", "--epochs", "6", "--patience",
                                 "2", "--min-delta", "100", where=where)
    assert status == 0, err[-3000:] + out[-3000:]
    assert records.load("fit01").state == records.SUCCEEDED
    history = json.loads((job_dir / "history.json").read_text())
    assert history["epoch"] == [0, 1, 2]  # stopped early, at the same epoch everywhere
    ended = replica_lines(out, "fit_ended")
    replicas = ["master-replica-0"] + (["worker-replica-0"] if where == "chief_and_worker"
                                       else [])
    assert sorted(ended) == replicas
    for label in replicas:
        assert ended[label] == [f"fit_ended replica={'chief' if 'master' in label else 'worker'}"
                                f"-0 epochs=[0, 1, 2]"], ended
        # the same logs on every worker (reduced over all of them)
        reported = [line.split(" loss=")[1] for line in
                    replica_lines(out, "epoch_end")[label]]
        assert reported == [f"{v:.6f}" for v in history["history"]["loss"]]
    assert "Epoch 3: early stopping" in out
    if where == "ps":  # trained on the workers, the ps holding the variables
        assert sorted(r.label for r in records.load("fit01").replicas) == [
            "master-replica-0", "ps-replica-0", "worker-replica-0", "worker-replica-1"]
        # Keras's steps an epoch: the 3276 examples validation_split=0.2 keeps, by 64
        assert re.search(r"master-replica-0\t52/52 - ", out), out[-3000:]
    assert set(history["history"]) >= {"loss", "sparse_categorical_accuracy", "val_loss",
                                       "val_sparse_categorical_accuracy"}
    assert sorted(os.listdir(job_dir / "ckpt")) == [f"mymodel_{e}.keras" for e in (1, 2, 3)]
    with open(job_dir / "log.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
    assert [round(float(r["val_loss"]), 5) for r in rows] == [
        round(v, 5) for v in history["history"]["val_loss"]]
    assert [round(v, 5) for v in epoch_scalars(str(job_dir / "logs" / "train"),
                                               "epoch_loss")] == [
        round(v, 5) for v in history["history"]["loss"]]
    assert not (job_dir / "backup").exists()  # BackupAndRestore's, deleted at the end


def test_backup_and_restore_resumes_a_job_killed_mid_epoch_at_its_epoch(capsys, tmp_path):
    job_dir = tmp_path / "pre01"
    status, out, err = fit_guide(capsys, tmp_path, "pre01", "--epochs", "4",
                                 "--die-at-epoch", "2")
    assert status != 0 and records.load("pre01").state == records.FAILED
    assert "killed in epoch 2 at batch 3" in out
    assert [line.split()[2] for line in replica_lines(out, "epoch_end")[
        "master-replica-0"]] == ["epoch=0", "epoch=1"]
    assert (job_dir / "backup").exists()
    status, out, err = fit_guide(capsys, tmp_path, "pre01", "--epochs", "4",
                                 "--die-at-epoch", "2", resume=True)
    assert status == 0, err[-3000:] + out[-3000:]
    assert records.load("pre01").state == records.SUCCEEDED
    for label in ("master-replica-0", "worker-replica-0"):  # both at the chief's epoch
        assert [line.split()[2] for line in replica_lines(out, "epoch_end")[label]] == \
            ["epoch=2", "epoch=3"]
    assert re.findall(r"master-replica-0\tEpoch (\d)/4", out) == ["3", "4"]
    history = json.loads((job_dir / "history.json").read_text())
    assert history["epoch"] == [2, 3]
    with open(job_dir / "log.csv") as f:
        assert [int(r["epoch"]) for r in csv.DictReader(f)] == [0, 1, 2, 3]
    assert sorted(os.listdir(job_dir / "ckpt")) == [f"mymodel_{e}.keras" for e in (1, 2, 3, 4)]


@pytest.mark.parametrize("where", ["basic", "chief_and_worker"])
def test_keras_io_custom_train_step_with_nested_metric_logs(capsys, tmp_path, where):
    """keras.io's "Customizing what happens in fit()": its train_step returns the
    compiled metrics' dict nested in its logs; fit's History holds them flattened."""
    from tests.support.fit_packages import write_custom_step_package
    pkg = write_custom_step_package(str(tmp_path / "custom"))
    extra = ["--config", config(tmp_path)] if where == "chief_and_worker" else []
    status, out, err = submit(capsys, "cts01", "--package-path", pkg, "--module-name",
                              "customstep.task", "--job-dir", str(tmp_path / "cts01"),
                              *extra)
    assert status == 0, err[-3000:] + out[-3000:]
    assert records.load("cts01").state == records.SUCCEEDED
    assert 'master-replica-0\thistory ["loss", "mae"]' in out
    assert re.search(r"master-replica-0\tEpoch 3/3", out)
    assert re.search(r"master-replica-0\t32/32 - .* - mae: \S+ - loss: \S+", out), out[-2000:]
    if extra:
        assert 'worker-replica-0\thistory ["loss", "mae"]' in out
