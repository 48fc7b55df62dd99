"""Tuning jobs on the local runner, with a tiny trainer the test writes (no TensorFlow)
that reports through the real cloudml-hypertune library: trials in parallel, each its own
job dir, TF_CONFIG trial and metrics file; the record's trainingOutput best first; early
stopping; maxFailedTrials; cancel and resumePreviousJobId. Every PID is checked dead."""
from __future__ import annotations

import pytest

import json
import os
import signal
import subprocess
import sys
import time

import yaml

from submit import jobs as records
from tests.support.common import ROOT, pid_alive
from tests.support.submit_cli import run as submit_in_process, write_package

TUNE_TASK = r'''
import json, os, sys, time
import hypertune  # the real cloudml-hypertune library
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
job_dir = sys.argv[sys.argv.index("--job-dir") + 1]
x = float(args["x"])
trial = os.environ["CLOUD_ML_TRIAL_ID"]
if "://" not in job_dir:  # a gs:// job dir's trial only reports
    os.makedirs(job_dir, exist_ok=True)
    with open(os.path.join(job_dir, "trial.json"), "w") as f:
        json.dump({"argv": sys.argv[1:], "tf_config": json.loads(os.environ["TF_CONFIG"]),
                   "env": {k: os.environ.get(k) for k in (
                       "CLOUD_ML_TRIAL_ID", "CLOUD_ML_HP_METRIC_TAG",
                       "CLOUD_ML_HP_METRIC_FILE", "CLOUD_ML_JOB_ID")}}, f)
    with open(os.path.join(os.path.dirname(job_dir), "runs.log"), "a") as f:
        f.write(f"{trial} {args['x']}\n")
h = hypertune.HyperTune()
if os.environ.get("TUNE_EMPTY_ON_TERM"):  # stopped while the library rewrites its file
    import signal
    def _term(*_):
        open(os.environ["CLOUD_ML_HP_METRIC_FILE"], "w").close()
        os._exit(143)
    signal.signal(signal.SIGTERM, _term)
hopeless = (trial in os.environ.get("TUNE_HOPELESS_TRIALS", "").split(",")
            or x < float(os.environ.get("TUNE_HOPELESS_BELOW", "-inf")))
steps = int(os.environ.get("TUNE_STEPS", "3"))
for step in range(1, steps + 1):
    # healthy values are at least 1 - 1.3**2 - 0.1 = -0.79: hopeless ones always lose
    value = -10.0 if hopeless else 1.0 - (x - 0.3) ** 2 - 0.1 / step
    h.report_hyperparameter_tuning_metric(hyperparameter_metric_tag="score",
                                          metric_value=value, global_step=step)
    print(f"step {step} score={value}", flush=True)
    time.sleep(float(os.environ.get("TUNE_SLEEP", "0.2")))
sys.exit(int(os.environ.get("TUNE_EXIT", "0")))
'''


def tuning_config(tmp_path, name="config.yaml", **hp) -> str:
    spec = {"goal": "MAXIMIZE", "hyperparameterMetricTag": "score", "maxTrials": 3,
            "maxParallelTrials": 2,
            "params": [{"parameterName": "x", "type": "DOUBLE", "minValue": -1.0,
                        "maxValue": 1.0}]}
    spec.update(hp)
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"trainingInput": {"hyperparameters": spec}}))
    return str(path)


def pkg_of(tmp_path) -> str:
    return write_package(tmp_path / "pkg", TUNE_TASK)


def submit(capsys, tmp_path, job_id, config, *extra):
    return submit_in_process(capsys, job_id, "--config", config, "--job-dir",
                             str(tmp_path / job_id), "--package-path", pkg_of(tmp_path),
                             "--module-name", "fakejob.task", *extra)


def assert_all_dead(record) -> None:
    pids = [r.pid for r in record.replicas if r.pid]
    assert pids, "no replica was started"
    assert [p for p in pids if pid_alive(p)] == []


def test_three_trials_two_at_a_time(capsys, tmp_path):
    status, out, err = submit(capsys, tmp_path, "tune01", tuning_config(tmp_path))
    assert status == 0, err
    record = records.load("tune01")
    assert record.state == records.SUCCEEDED
    output = record.training_output
    assert output["isHyperparameterTuningJob"] is True
    assert output["hyperparameterMetricTag"] == "score"
    assert output["completedTrialCount"] == "3"
    trials = output["trials"]
    assert sorted(t["trialId"] for t in trials) == ["1", "2", "3"]
    values = [t["finalMetric"]["objectiveValue"] for t in trials]
    assert values == sorted(values, reverse=True)  # best first
    job_dir = tmp_path / "tune01"
    metric_files = set()
    for t in trials:
        assert t["state"] == "SUCCEEDED" and not t["isTrialStoppedEarly"]
        assert t["finalMetric"]["trainingStep"] == "3"
        assert [m["trainingStep"] for m in t["allMetrics"]] == ["1", "2", "3"]
        x = float(t["hyperparameters"]["x"])
        assert -1.0 <= x <= 1.0
        assert abs(t["finalMetric"]["objectiveValue"] - (1.0 - (x - 0.3) ** 2 - 0.1 / 3)) \
            < 1e-9
        assert t["startTime"] <= t["endTime"]
        seen = json.loads((job_dir / t["trialId"] / "trial.json").read_text())
        assert seen["argv"] == [f"--x={t['hyperparameters']['x']}", "--job-dir",
                                str(job_dir / t["trialId"])]
        assert seen["tf_config"]["task"]["trial"] == t["trialId"]
        env = seen["env"]
        assert (env["CLOUD_ML_TRIAL_ID"], env["CLOUD_ML_HP_METRIC_TAG"],
                env["CLOUD_ML_JOB_ID"]) == (t["trialId"], "score", "tune01")
        metric_files.add(env["CLOUD_ML_HP_METRIC_FILE"])
        log = job_dir / "logs" / t["trialId"] / "master-replica-0.log"
        assert f"\t{t['trialId']}/master-replica-0\tstep 3 score=" in log.read_text()
    assert len(metric_files) == 3  # parallel trials never share the library's file
    services = "".join(p.read_text() for p in (job_dir / "logs").glob("**/service.log"))
    assert "started (pid" in services
    assert "pre-started" not in services  # no TensorFlow in this trainer: none started ahead
    assert (job_dir / "hptuning" / "objective.png").read_bytes()[:4] == b"\x89PNG"
    assert (job_dir / "hptuning" / "optuna-journal.log").exists()
    assert sorted(r.label for r in record.replicas) == [
        "1/master-replica-0", "2/master-replica-0", "3/master-replica-0"]
    assert_all_dead(record)
    assert "trial 1 started: --x=" in out
    # the same record in the job dir, and `jobs describe`'s table, best first
    with open(job_dir / "jobs" / "tune01.json") as f:
        assert json.load(f)["training_output"]["trials"] == trials
    status, out, _ = submit_in_process(capsys, "jobs", "describe", "tune01")
    assert status == 0
    output = yaml.safe_load(out)["trainingOutput"]
    assert output["trials"] == trials and output["isHyperparameterTuningJob"] is True
    status, out, _ = submit_in_process(capsys, "jobs", "describe", "tune01", "--summarize")
    assert status == 0
    table = out.split("trials completed; best first)\n")[1].splitlines()
    assert table[0].split() == ["TRIAL", "STATE", "SCORE", "STEP", "x"]
    assert [row.split()[0] for row in table[1:4]] == [t["trialId"] for t in trials]
    # one trial's replica picked by --task-name
    status, out, _ = submit_in_process(capsys, "jobs", "stream-logs", "tune01",
                                       "--task-name", f"{trials[0]['trialId']}/"
                                       "master-replica-0")
    assert status == 0 and out.count("step 3 score=") == 1


def test_hopeless_trials_are_stopped_early(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNE_HOPELESS_TRIALS", "3,4")
    monkeypatch.setenv("TUNE_STEPS", "40")
    monkeypatch.setenv("TUNE_SLEEP", "0.05")
    # a trial's file is empty when it ends: what the tuner read before is what counts
    monkeypatch.setenv("TUNE_EMPTY_ON_TERM", "1")
    config = tuning_config(tmp_path, maxTrials=4, maxParallelTrials=1,
                           enableTrialEarlyStopping=True)
    status, _, err = submit(capsys, tmp_path, "tune02", config)
    assert status == 0, err
    record = records.load("tune02")
    by_id = {t["trialId"]: t for t in record.training_output["trials"]}
    for stopped in ("3", "4"):
        t = by_id[stopped]
        assert t["isTrialStoppedEarly"] and t["state"] == "SUCCEEDED"
        assert int(t["finalMetric"]["trainingStep"]) < 40  # stopped long before the end
        rec = next(r for r in record.replicas if r.label == f"{stopped}/master-replica-0")
        assert rec.state == "STOPPED" and rec.exit_code == 143  # SIGTERM, as any replica
    for ran in ("1", "2"):
        assert not by_id[ran]["isTrialStoppedEarly"]
        assert by_id[ran]["finalMetric"]["trainingStep"] == "40"
    # trials that ran to their end rank before those stopped early
    assert [t["trialId"] for t in record.training_output["trials"]][2:] in (
        ["3", "4"], ["4", "3"])
    assert_all_dead(record)


def test_max_failed_trials_ends_the_job_failed(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNE_EXIT", "3")
    config = tuning_config(tmp_path, maxTrials=5, maxParallelTrials=1, maxFailedTrials=2)
    status, _, err = submit(capsys, tmp_path, "tune03", config)
    assert status == 1
    assert "2 trial(s) failed, the job's maxFailedTrials" in err
    record = records.load("tune03")
    assert record.state == records.FAILED
    states = sorted(t["state"] for t in record.training_output["trials"])
    assert states == ["FAILED", "FAILED"]
    assert "exited with a non-zero status of 3" in \
        record.training_output["trials"][0]["errorMessage"]
    assert sorted(os.listdir(tmp_path / "tune03" / "logs")) == ["1", "2", "service.log"]
    assert_all_dead(record)


def test_a_tag_no_report_carries_fails_the_trial_naming_what_it_reported(capsys, tmp_path):
    """hyperparameterMetricTag auc with a trainer that reports only score: no trial
    succeeds on a number that is not there; each fails with one line, and the job past
    maxFailedTrials."""
    config = tuning_config(tmp_path, hyperparameterMetricTag="auc", maxTrials=4,
                           maxParallelTrials=1, maxFailedTrials=2)
    status, out, err = submit(capsys, tmp_path, "tune07", config)
    assert status == 1
    why = "no report carries the hyperparameterMetricTag 'auc'; it reported score"
    assert f"trial 1 FAILED: {why}" in out and f"trial 2 FAILED: {why}" in out
    assert "2 trial(s) failed, the job's maxFailedTrials" in err
    record = records.load("tune07")
    assert record.state == records.FAILED
    trials = record.training_output["trials"]
    assert [t["errorMessage"] for t in trials] == [why, why]
    assert not any(t.get("finalMetric") for t in trials)
    assert_all_dead(record)


def _cli(*argv, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "submit", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow  # long: CI runs it in the slow step
def test_cancel_then_resume_runs_no_finished_trial_again(tmp_path):
    env = {**os.environ, "TUNE_STEPS": "4", "TUNE_SLEEP": "0.4"}
    common = ["--package-path", pkg_of(tmp_path), "--module-name", "fakejob.task"]
    first = tuning_config(tmp_path, "first.yaml", maxTrials=6, maxParallelTrials=1)
    out = _cli("tune04", "--config", first, "--job-dir", str(tmp_path / "tune04"),
               *common, "--async", env=env)
    assert out.returncode == 0, out.stderr
    supervisor = records.load("tune04").supervisor_pid
    try:
        _cancel_after_two_trials()
    finally:
        _kill_group(supervisor)  # only if the test failed before `jobs cancel` ended it
    record = records.load("tune04")
    assert record.state == records.CANCELLED
    assert_all_dead(record)
    finished = {t["trialId"]: t["hyperparameters"]["x"]
                for t in record.training_output["trials"] if t["state"] == "SUCCEEDED"}
    assert len(finished) >= 2
    assert len(finished) < 6

    second = tuning_config(tmp_path, "second.yaml", maxTrials=6, maxParallelTrials=2,
                           resumePreviousJobId="tune04")
    out = _cli("tune05", "--config", second, "--job-dir", str(tmp_path / "tune05"),
               *common, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"{len(finished)} finished trial(s) are not run again" in out.stdout
    record = records.load("tune05")
    assert record.state == records.SUCCEEDED
    trials = record.training_output["trials"]
    assert len(trials) == 6 and record.training_output["completedTrialCount"] == "6"
    resumed = {t["trialId"]: t["hyperparameters"]["x"] for t in trials
               if t["trialId"] in finished}
    assert resumed == finished
    runs = (tmp_path / "tune05" / "runs.log").read_text().split()
    ran_ids = runs[0::2]
    assert len(ran_ids) == 6 - len(finished)
    assert not set(ran_ids) & set(finished)  # new trial ids, no finished trial again
    assert not set(runs[1::2]) & set(finished.values())
    assert_all_dead(record)


def _cancel_after_two_trials():
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        record = records.load("tune04")
        if int(record.training_output.get("completedTrialCount", "0")) >= 2:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("two trials did not finish in 120 s")
    cancel = _cli("jobs", "cancel", "tune04")
    assert cancel.returncode == 0 and "Job [tune04] CANCELLED." in cancel.stdout, \
        cancel.stderr


def _kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


SUMMARY_TASK = r'''
import os, sys
import tensorflow as tf
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
job_dir = sys.argv[sys.argv.index("--job-dir") + 1]
x = float(args["x"])
for folder, offset in (("train", 0.5), ("eval", 0.0)):
    writer = tf.summary.create_file_writer(os.path.join(job_dir, "summaries", folder))
    with writer.as_default():
        for step in (10, 20):
            tf.summary.scalar("score", 1.0 - (x - 0.3) ** 2 + offset - 1.0 / step, step=step)
    writer.close()
'''


def test_a_trainer_reporting_only_tensorboard_summaries_is_tuned_by_them(capsys, tmp_path):
    """Cloud ML also read the metric from TensorBoard summaries under the trial's job dir
    whose tag is the metric tag; of train/ and eval/ the eval ones count."""
    pkg = write_package(tmp_path / "pkg", SUMMARY_TASK)
    status, _, err = submit_in_process(
        capsys, "tune06", "--config", tuning_config(tmp_path, maxTrials=2),
        "--job-dir", str(tmp_path / "tune06"), "--package-path", pkg, "--module-name",
        "fakejob.task")
    assert status == 0, err
    trials = records.load("tune06").training_output["trials"]
    assert len(trials) == 2
    for t in trials:
        x = float(t["hyperparameters"]["x"])
        assert t["finalMetric"]["trainingStep"] == "20"
        assert abs(t["finalMetric"]["objectiveValue"] - (1.0 - (x - 0.3) ** 2 - 0.05)) < 1e-6
        assert [m["trainingStep"] for m in t["allMetrics"]] == ["10", "20"]


def test_a_memory_job_dir_gets_every_trial_and_the_study(capsys, tmp_path, memfs):
    status, _, err = submit_in_process(
        capsys, "tune07", "--config", tuning_config(tmp_path, maxTrials=2), "--job-dir",
        "memory://jobs/tune07", "--package-path", pkg_of(tmp_path), "--module-name",
        "fakejob.task")
    assert status == 0, err
    record = records.load("tune07")
    assert record.state == records.SUCCEEDED
    files = set(memfs.find("/jobs/tune07"))
    for trial in ("1", "2"):
        assert f"/jobs/tune07/{trial}/trial.json" in files
        assert f"/jobs/tune07/logs/{trial}/master-replica-0.log" in files
    assert {"/jobs/tune07/hptuning/optuna-journal.log",
            "/jobs/tune07/hptuning/objective.png"} <= files
    seen = json.loads(memfs.cat("/jobs/tune07/1/trial.json"))
    assert seen["argv"][-2] == "--job-dir" and seen["argv"][-1].endswith("/job-dir/1")
    assert_all_dead(record)


def test_grid_search_stops_hopeless_parameter_values_early(tmp_path, monkeypatch):
    """Parameter values below 0 make training hopeless. The grid's order is Optuna's,
    fixed here by the tuner's seed so that two good values finish first (the median
    pruner compares with finished trials); every hopeless value is then stopped early,
    and the job ends when the grid is done."""
    from submit import lifecycle
    from submit.jobdef import spec as specs
    from submit.local import plan as plans, tuner
    from submit.runners.engine import EngineOptions
    from submit.runners.local import LocalEngine
    monkeypatch.setenv("TUNE_HOPELESS_BELOW", "0")
    monkeypatch.setenv("TUNE_STEPS", "40")
    monkeypatch.setenv("TUNE_SLEEP", "0.05")
    hp = {"goal": "MAXIMIZE", "hyperparameterMetricTag": "score", "maxTrials": 10,
          "maxParallelTrials": 1, "enableTrialEarlyStopping": True,
          "algorithm": "GRID_SEARCH",
          "params": [{"parameterName": "x", "type": "DISCRETE",
                      "discreteValues": [-0.6, -0.5, 0.1, 0.2, 0.3, 0.4]}]}
    spec = specs.resolve(specs.Flags("tune08", job_dir=str(tmp_path / "j"),
                                     module_name="fakejob.task", args=(), staged=False),
                         specs.training_config({"hyperparameters": hp}))
    engine = LocalEngine(EngineOptions(), source_dir=pkg_of(tmp_path))
    rendered = engine.render(spec, None)
    record = lifecycle.new_record(engine, spec, None, rendered)
    state = tuner.Tuner(plans.JobPlan.from_dict(rendered.body), record, seed=4).run()
    assert state == records.SUCCEEDED
    trials = record.training_output["trials"]
    assert len(trials) == 6  # the grid, not maxTrials
    stopped = {t["hyperparameters"]["x"] for t in trials if t["isTrialStoppedEarly"]}
    # the median rule: below the median of finished trials at the same step is stopped
    assert {"-0.6", "-0.5"} <= stopped
    ran = [t["hyperparameters"]["x"] for t in trials if not t["isTrialStoppedEarly"]]
    assert ran[0] == "0.3" and not [x for x in ran if x.startswith("-")]
    for t in trials:
        if t["isTrialStoppedEarly"]:
            assert int(t["finalMetric"]["trainingStep"]) < 40
    assert_all_dead(record)


@pytest.mark.slow  # long: CI runs it in the slow step
def test_a_killed_launcher_loses_no_finished_trial(tmp_path):
    """SIGKILL to the supervisor of a tuning job: its trials' replicas die with it, and
    every trial that had finished is in the study that resumePreviousJobId continues."""
    env = {**os.environ, "TUNE_STEPS": "4", "TUNE_SLEEP": "0.4"}
    common = ["--package-path", pkg_of(tmp_path), "--module-name", "fakejob.task"]
    first = tuning_config(tmp_path, "first.yaml", maxTrials=4, maxParallelTrials=1)
    out = _cli("tune09", "--config", first, "--job-dir", str(tmp_path / "tune09"),
               *common, "--async", env=env)
    assert out.returncode == 0, out.stderr
    supervisor = records.load("tune09").supervisor_pid
    try:
        deadline = time.monotonic() + 120
        while int(records.load("tune09").training_output.get("completedTrialCount", "0")) \
                < 1:
            assert time.monotonic() < deadline, "no trial finished in 120 s"
            time.sleep(0.2)
    finally:
        _kill_group(supervisor)
    record = records.load("tune09")
    deadline = time.monotonic() + 30
    while [r for r in record.replicas if r.pid and pid_alive(r.pid)]:
        assert time.monotonic() < deadline, "a replica outlived its launcher"
        time.sleep(0.2)
    finished = {t["trialId"]: t["hyperparameters"]["x"]
                for t in record.training_output["trials"] if t["state"] == "SUCCEEDED"}
    second = tuning_config(tmp_path, "second.yaml", maxTrials=4, maxParallelTrials=2,
                           resumePreviousJobId="tune09")
    out = _cli("tune10", "--config", second, "--job-dir", str(tmp_path / "tune10"),
               *common, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    trials = records.load("tune10").training_output["trials"]
    assert {t["trialId"]: t["hyperparameters"]["x"] for t in trials
            if t["trialId"] in finished} == finished
    ran = (tmp_path / "tune10" / "runs.log").read_text().split()[0::2]
    assert len(ran) == 4 - len(finished) and not set(ran) & set(finished)


def test_a_gs_job_dir_gets_the_logs_and_the_study(capsys, tmp_path, gcs_emulator):
    from mljob import storage
    job_dir = "gs://mljob-test/tuning/tune11"
    status, _, err = submit_in_process(
        capsys, "tune11", "--config", tuning_config(tmp_path, maxTrials=2), "--job-dir",
        job_dir, "--package-path", pkg_of(tmp_path), "--module-name", "fakejob.task")
    assert status == 0, err
    assert records.load("tune11").state == records.SUCCEEDED
    fs, root = storage.filesystem(job_dir)
    fs.invalidate_cache()
    files = {os.path.relpath(f, root) for f in fs.find(root)}
    assert {"hptuning/optuna-journal.log", "hptuning/objective.png",
            "logs/1/master-replica-0.log", "logs/2/master-replica-0.log",
            "jobs/tune11.json"} <= files
