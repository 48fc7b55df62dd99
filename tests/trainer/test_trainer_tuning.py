"""The bundled trainer inside a tuning trial: it reports eval accuracy and loss per
evaluation in the cloudml-hypertune file, and takes the tuned parameters as flags in
either spelling (--learning_rate=0.01 as well as --learning-rate 0.01)."""
from __future__ import annotations

import os

import pytest

from mljob import hypertune
from trainer import task
from tests.support.trainer_runs import FAST, export_accuracy, read, start, wait_exit


def test_a_trial_reports_each_evaluation_and_its_flags_shape_the_model(reaper, tmp_path):
    metrics = tmp_path / "trial" / "output.metrics"
    log = tmp_path / "trial.log"
    job = tmp_path / "job" / "1"
    args = [*FAST, "--train-steps", "90", "--eval-every", "30", "--log-every", "30",
            "--job-dir", str(job), "--learning_rate=0.01", "--hidden_units=24",
            "--dropout=0.25", "--batch_size=50"]
    proc = start(reaper, log, args, env={
        "CLOUD_ML_HP_METRIC_FILE": str(metrics), "CLOUD_ML_TRIAL_ID": "1",
        "CLOUD_ML_HP_METRIC_TAG": "training/hptuning/metric"})
    assert wait_exit(proc, 240, log) == 0, read(log)[-3000:]
    accuracy = hypertune.read_reports(str(metrics), "accuracy")
    loss = hypertune.read_reports(str(metrics), "loss")
    assert [r.step for r in accuracy] == [30, 60, 90] == [r.step for r in loss]
    assert hypertune.read_reports(str(metrics), "training/hptuning/metric") == accuracy
    # The last report is the final evaluation the log prints.
    assert f"accuracy={accuracy[-1].value:.4f}" in read(log)
    assert "learning_rate=0.01 lr_schedule=cosine" in read(log)  # the peak of the schedule
    # --hidden_units 24 shaped the model, and its export has that shape and works.
    import tensorflow as tf
    shapes = [tuple(shape) for _, shape in
              tf.train.list_variables(str(job / "model" / "variables" / "variables"))]
    assert (784, 24) in shapes and (24, 10) in shapes
    assert export_accuracy(str(job / "model")) > 0.3


def test_outside_a_trial_no_metrics_file_is_written(reaper, tmp_path):
    log = tmp_path / "run.log"
    env = {k: "" for k in ("CLOUD_ML_HP_METRIC_FILE", "CLOUD_ML_TRIAL_ID")}
    proc = start(reaper, log, [*FAST, "--train-steps", "10", "--eval-every", "5",
                               "--job-dir", str(tmp_path / "job")], env=env)
    assert wait_exit(proc, 180, log) == 0, read(log)[-3000:]
    assert not os.path.exists(hypertune.DEFAULT_HP_METRIC_FILE) or \
        os.path.getmtime(hypertune.DEFAULT_HP_METRIC_FILE) < os.path.getmtime(log)


@pytest.mark.parametrize("argv,value", [
    (["--learning_rate=0.05"], ("learning_rate", 0.05)),
    (["--learning-rate", "0.05"], ("learning_rate", 0.05)),
    (["--hidden-units=7"], ("hidden_units", 7)),
    (["--batch_size", "8"], ("batch_size", 8)),
    (["--batch_size=64.0"], ("batch_size", 64)),  # a DISCRETE value from Vertex AI
])
def test_both_spellings_of_a_flag(argv, value):
    args = task.parser().parse_args(argv)
    assert getattr(args, value[0]) == value[1]


def test_dropout_defaults_follow_the_model():
    parse = task.parser().parse_args
    assert task.dropout_of(parse(["--model", "cnn"])) == 0.4
    assert task.dropout_of(parse(["--model", "mlp"])) == 0.0
    assert task.dropout_of(parse(["--model", "mlp", "--dropout=0.3"])) == 0.3


@pytest.mark.parametrize("argv,flag", [
    # the error names the flag as declared, whichever spelling was given
    (["--hidden_units=0"], "--hidden-units"),
    (["--hidden-units", "many"], "--hidden-units"),
    (["--dropout=1.5"], "--dropout"),
    (["--batch_size=64.5"], "--batch-size"),
])
def test_bad_tuning_flag_values_are_one_line_usage_errors(capsys, argv, flag):
    assert task.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and flag in lines[0], lines
