"""A user's unchanged `model.fit` script in a job whose config gives it an evaluator
replica (`evaluatorCount: 1`): under parameter servers (keras.io's timeseries classifier,
chief + 2 workers + 1 ps + 1 evaluator; keras.io's fit guide, its arrays and
validation_split, too) and under MultiWorkerMirrored (keras.io's fit guide, chief + 1
worker + 1 evaluator). The job SUCCEEDS; the script's strategy on the
evaluator is the default one (TensorFlow's would join the training cluster: the job
failed with "Could not start gRPC server" under ps, with KeyError 'evaluator' under
MultiWorkerMirrored); the evaluator's `fit` evaluates the chief's published epochs, each
equal to what Keras's `model.evaluate` gives on that epoch's weights (the chief's own
validation of them), writes them in the TensorBoard run `evaluator` and in the job's
summaries the console draws, ends by itself after the chief's last epoch, and is gone
by its PID at the end."""
from __future__ import annotations

import json
import os
import re

import pytest

from mljob.procs import pid_alive
from submit import jobs as records
from tests.support.fit_packages import write_callbacks_package
from tests.support.fit_packages_ps import write_fit_package
from tests.support.submit_cli import run as submit_in_process

pytestmark = pytest.mark.slow  # TensorFlow replicas, half a minute or more each
pytest.importorskip("tensorflow")

PS_WITH_EVALUATOR = ("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
                     "  workerCount: 2\n  parameterServerCount: 1\n  evaluatorCount: 1\n"
                     "  useChiefInTfConfig: true\n")
MWMS_WITH_EVALUATOR = ("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
                       "  workerType: standard\n  workerCount: 1\n  evaluatorCount: 1\n")
LINE = re.compile(r"evaluator-replica-0\tevaluator: epoch (\d+)/\d+ \(step (\d+)\): "
                  r"val_loss=(\S+)")


def _submit(capsys, job_id: str, package: str, module: str, job_dir, config: str, *args):
    status, out, err = submit_in_process(
        capsys, job_id, "--package-path", package, "--module-name", module, "--job-dir",
        str(job_dir), "--config", config, "--", *args)
    assert status == 0, err + out[-4000:]
    record = records.load(job_id)
    assert record.state == records.SUCCEEDED, out[-4000:]
    evaluator = record.replica("evaluator-replica-0")
    assert evaluator.exit_codes == [0], out[-4000:]  # ended by itself, status 0
    for replica in record.replicas:  # nothing of the job is left
        assert replica.pid and not pid_alive(replica.pid), replica.label
    return out


def _scalars(folder, tag: str) -> dict[int, float]:
    import tensorflow as tf
    found: dict[int, float] = {}
    for name in sorted(os.listdir(folder)):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(folder, name)):
            for value in event.summary.value:
                if value.tag == tag:
                    found[event.step] = float(tf.make_ndarray(value.tensor))
    return found


def _check_evaluations(out: str, job_dir, log_dir, steps_per_epoch: int | None):
    history = json.loads((job_dir / "history.json").read_text())
    val_loss = history["history"]["val_loss"]  # the chief's evaluate of each epoch
    lines = {int(e): (int(s), float(v)) for e, s, v in LINE.findall(out)}
    assert lines, out[-4000:]
    last = len(history["epoch"])
    assert max(lines) == last  # the chief's last epoch is evaluated, then it ends
    assert f"evaluator finished: the chief's last epoch ({last}) evaluated" in out
    for epoch, (step, loss) in lines.items():
        assert loss == pytest.approx(val_loss[epoch - 1], rel=1e-4, abs=1e-5), epoch
        if steps_per_epoch:
            assert step == epoch * steps_per_epoch
    # TensorBoard: the run `evaluator` beside the chief's `validation`, epoch by epoch
    written = _scalars(log_dir / "evaluator", "epoch_loss")
    assert written == pytest.approx({e - 1: v for e, (_, v) in lines.items()}, rel=1e-5)
    assert sorted(_scalars(log_dir / "validation", "epoch_loss")) == list(range(last))
    # and the job's summaries, as the console draws a job's curves: run `eval` by step
    from submit.query.curves import JobCurves
    curves = JobCurves(str(job_dir)).read()["metrics/loss"]["eval"]
    assert curves == pytest.approx({s: v for s, v in lines.values()}, rel=1e-5)
    # the evaluator never ran what the script does after fit: History is the chief's
    assert history["epoch"] == list(range(last))
    assert "evaluator: the script's " in out


def test_ps_job_with_an_evaluator_evaluates_the_chief_s_epochs(capsys, tmp_path,
                                                                monkeypatch):
    folder = write_fit_package(str(tmp_path / "project"), "timeseries")
    (tmp_path / "project" / "config.yaml").write_text(PS_WITH_EVALUATOR)
    monkeypatch.chdir(folder)
    job_dir = tmp_path / "job"
    out = _submit(capsys, "tsevl01", "timeseriesjob", "timeseriesjob.task", job_dir,
                  "config.yaml")
    _check_evaluations(out, job_dir, job_dir / "logs", steps_per_epoch=8)
    assert "ParameterServerStrategy is the default strategy" in out


def test_multiworker_job_with_an_evaluator_evaluates_the_chief_s_epochs(capsys, tmp_path):
    package = write_callbacks_package(str(tmp_path / "guide"))
    config = tmp_path / "mwms.yaml"
    config.write_text(MWMS_WITH_EVALUATOR)
    job_dir = tmp_path / "job"
    out = _submit(capsys, "fgevl01", package, "fitguide.task", job_dir, str(config),
                  "--epochs", "3")
    _check_evaluations(out, job_dir, job_dir / "logs", steps_per_epoch=None)
    assert "MultiWorkerMirroredStrategy is the default strategy" in out


def test_ps_job_with_an_evaluator_evaluates_the_fit_guide_s_validation_split(capsys,
                                                                             tmp_path):
    """keras.io's fit guide (fit on arrays, validation_split=0.2) under parameter
    servers: the chief trains Keras's 52 steps an epoch and validates the split; the
    evaluator evaluates the same split of the same arrays on each published epoch."""
    package = write_callbacks_package(str(tmp_path / "guide"))
    config = tmp_path / "ps.yaml"
    config.write_text(PS_WITH_EVALUATOR)
    job_dir = tmp_path / "job"
    out = _submit(capsys, "fgpse01", package, "fitguide.task", job_dir, str(config),
                  "--epochs", "2")
    _check_evaluations(out, job_dir, job_dir / "logs", steps_per_epoch=52)
    assert "ParameterServerStrategy is the default strategy" in out
