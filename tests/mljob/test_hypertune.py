"""mljob.hypertune: the cloudml-hypertune file format, written as the library writes it
and read back by the tuner, including files the real library wrote."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from mljob import hypertune


def trial_env(tmp_path, tag="accuracy", trial="3"):
    return {"CLOUD_ML_HP_METRIC_FILE": str(tmp_path / "t" / "output.metrics"),
            "CLOUD_ML_HP_METRIC_TAG": tag, "CLOUD_ML_TRIAL_ID": trial}


def test_lines_have_the_library_fields(tmp_path):
    env = trial_env(tmp_path)
    writer = hypertune.HyperTune(env)
    writer.report_hyperparameter_tuning_metric("accuracy", 0.5, global_step=100)
    writer.report_hyperparameter_tuning_metric("accuracy", 0.75, global_step=200)
    lines = [json.loads(x) for x in open(env["CLOUD_ML_HP_METRIC_FILE"])]
    assert [x["accuracy"] for x in lines] == ["0.5", "0.75"]
    assert lines[1]["global_step"] == "200" and lines[1]["trial"] == "3"
    assert isinstance(lines[1]["timestamp"], float)
    reports = hypertune.read_reports(env["CLOUD_ML_HP_METRIC_FILE"], "accuracy")
    assert [(r.step, r.value) for r in reports] == [(100, 0.5), (200, 0.75)]


def test_only_the_last_100_reports_are_kept(tmp_path):
    env = trial_env(tmp_path)
    writer = hypertune.HyperTune(env)
    for step in range(1, 131):
        writer.report({"accuracy": step / 1000}, step)
    reports = hypertune.read_reports(env["CLOUD_ML_HP_METRIC_FILE"], "accuracy")
    assert len(reports) == 100 and reports[0].step == 31 and reports[-1].step == 130


def test_evaluation_reports_the_job_tag_and_the_guessed_tags(tmp_path):
    env = trial_env(tmp_path, tag="training/hptuning/metric")
    assert hypertune.report_evaluation(50, loss=0.9, metrics={"accuracy": 0.6}, environ=env)
    path = env["CLOUD_ML_HP_METRIC_FILE"]
    for tag, value in (("training/hptuning/metric", 0.6), ("accuracy", 0.6), ("loss", 0.9)):
        assert [(r.step, r.value) for r in hypertune.read_reports(path, tag)] == [(50, value)]
    for tag, value in (("val_loss", 0.25), ("val_accuracy", 0.5), ("loss", 0.25)):
        env = trial_env(tmp_path / tag, tag=tag)
        hypertune.report_evaluation(7, loss=0.25, metrics={"accuracy": 0.5}, environ=env)
        assert hypertune.read_reports(env["CLOUD_ML_HP_METRIC_FILE"], tag)[0].value == value


def test_a_tag_nothing_measures_is_never_filled_in(tmp_path):
    """`auc` when the model measures accuracy only: the accuracy is not reported as auc
    (the tuner would optimise it under the wrong name); the file says what was."""
    for tag in ("auc", "val_auc", "my_loss"):
        env = trial_env(tmp_path / tag, tag=tag)
        assert hypertune.report_evaluation(9, loss=0.3, metrics={"accuracy": 0.92},
                                           environ=env)
        path = env["CLOUD_ML_HP_METRIC_FILE"]
        assert hypertune.read_reports(path, tag) == []
        assert hypertune.reported_tags(path) == ["accuracy", "loss"]
    assert hypertune.reported_tags(str(tmp_path / "missing")) == []


def test_outside_a_trial_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not hypertune.report_evaluation(1, loss=1.0, metrics={"accuracy": 0.1}, environ={})
    assert os.listdir(tmp_path) == []


def test_damaged_lines_are_skipped(tmp_path):
    path = tmp_path / "output.metrics"
    path.write_text('{"accuracy": "0.5", "global_step": "10", "timestamp": 1.0}\n'
                    '[1, 2]\n{"accuracy": "nan", "global_step": "11", "timestamp": 2.0}\n'
                    '{"accuracy": "x"}\n{"loss": "0.1"}\n{"accuracy": "0.6", "glo')
    reports = hypertune.read_reports(str(path), "accuracy")
    assert [(r.step, r.value) for r in reports] == [(10, 0.5)]
    assert hypertune.read_reports(str(tmp_path / "missing"), "accuracy") == []


def test_the_real_library_file_is_read(tmp_path):
    """A trainer that imports cloudml-hypertune's `hypertune` (a real pip package)."""
    env = {**os.environ, **trial_env(tmp_path, tag="my_metric", trial="7")}
    code = ("import hypertune\nh = hypertune.HyperTune()\n"
            "for step in (10, 20, 30):\n"
            "    h.report_hyperparameter_tuning_metric(hyperparameter_metric_tag="
            "'my_metric', metric_value=step / 100, global_step=step)\n")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    reports = hypertune.read_reports(env["CLOUD_ML_HP_METRIC_FILE"], "my_metric")
    assert [(r.step, r.value) for r in reports] == [(10, 0.1), (20, 0.2), (30, 0.3)]
