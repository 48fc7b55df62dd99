"""A tuning job on the bundled trainer (the MLP on the packaged sample, a few hundred
steps; learning rate on a log scale and dropout; MAXIMIZE accuracy; 8 trials, 2 at a
time): SUCCEEDED, the record's best trial is the one whose reported accuracy is best,
every trial has its own checkpoints and export, and no process is left."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from mljob import hypertune
from submit import jobs as records
from tests.support.common import ROOT, pid_alive
from tests.support.trainer_runs import SAMPLE

TRAIN = ["--model", "mlp", "--data-dir", SAMPLE, "--train-steps", "200", "--eval-every",
         "100", "--log-every", "100", "--checkpoint-every", "200", "--seed", "1"]


@pytest.mark.slow
def test_bundled_trainer_tuned_for_accuracy(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {"hyperparameters": {
        "goal": "MAXIMIZE", "hyperparameterMetricTag": "accuracy", "maxTrials": 8,
        "maxParallelTrials": 2,
        "params": [{"parameterName": "learning_rate", "type": "DOUBLE", "minValue": 1e-4,
                    "maxValue": 0.3, "scaleType": "UNIT_LOG_SCALE"},
                   {"parameterName": "dropout", "type": "DOUBLE", "minValue": 0.0,
                    "maxValue": 0.5}]}}}))
    job_dir = tmp_path / "tune"
    out = subprocess.run([sys.executable, "-m", "submit", "tune_mlp", "--config",
                          str(config), "--job-dir", str(job_dir), "--", *TRAIN], cwd=ROOT,
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    record = records.load("tune_mlp")
    assert record.state == records.SUCCEEDED
    trials = record.training_output["trials"]
    assert len(trials) == 8 and record.training_output["completedTrialCount"] == "8"
    run_dir = os.path.join(os.environ["MLJOB_HOME"], "runs", "tune_mlp", "trials")
    final = {}
    for t in trials:
        trial_dir = job_dir / t["trialId"]
        assert (trial_dir / "model" / "saved_model.pb").exists()
        assert (trial_dir / "checkpoints" / "checkpoint").exists()
        reports = hypertune.read_reports(
            os.path.join(run_dir, t["trialId"], "output.metrics"), "accuracy")
        assert [r.step for r in reports] == [100, 200]
        final[t["trialId"]] = reports[-1].value
        assert t["finalMetric"] == {"trainingStep": "200", "objectiveValue":
                                    reports[-1].value}
    assert trials[0]["trialId"] == max(final, key=final.get)
    assert len({t["hyperparameters"]["learning_rate"] for t in trials}) == 8
    pids = [r.pid for r in record.replicas if r.pid]
    assert len(pids) == 8 and not [p for p in pids if pid_alive(p)]
    assert (job_dir / "hptuning" / "objective.png").exists()
