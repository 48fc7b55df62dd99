"""A tuning job on `--runner ray`, on a real Ray head started here (3 logical CPUs,
stopped by PID when the module ends): the study runs in the submitting process (or a
detached one with --async), each trial is a Ray job of a tiny user package, whose
trainer reports its metric as cloudml-hypertune does (JSON lines in
$CLOUD_ML_HP_METRIC_FILE, on its node) and fails or hangs as its flags say.

- a grid of three points, two trials at a time: SUCCEEDED, the trials table best first
  (Cloud ML's trainingOutput, as for the local runner), the failed trial's error, each
  trial its own job dir and TF_CONFIG `task.trial`, the trials overlapping two at a
  time and never three, `jobs describe` and `jobs stream-logs --task-name 1/...`;
- maxFailedTrials 1 with every trial failing: FAILED after the first failure;
- early stopping: a third trial worse than the first two at step 1 is stopped (its Ray
  job STOPPED) and marked isTrialStoppedEarly;
- --async with trials that hang: `jobs cancel` stops both running trials' Ray jobs
  and every replica process;
- the --async study's process killed (SIGKILL): `jobs cancel` stops the trial's Ray job
  the record names;
- more trials at once than the cluster holds: one line before anything is staged.
"""
from __future__ import annotations

import json
import os
import signal
import time

import pytest
import yaml

from submit import jobs as records
from tests.support.ray_cluster import head, job_processes, skip_reason
from tests.support.submit_cli import nothing_written, one_error_line, run, write_package

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

TASK = """import argparse, json, os, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--x", type=int, default=0)
parser.add_argument("--job-dir")
parser.add_argument("--fail", action="store_true")
parser.add_argument("--hang", action="store_true")
parser.add_argument("--by-trial", action="store_true")  # later trials worse; 3 waits
parser.add_argument("--meet", action="store_true")  # run until a second trial has started
args, _ = parser.parse_known_args()
task = json.loads(os.environ["TF_CONFIG"])["task"]
started = time.time()
print(f"trial {task.get('trial')} x={args.x}", flush=True)
if args.meet:  # two at once shown whatever a Ray job's start costs (60 s at most)
    met = os.path.join(os.path.dirname(args.job_dir), "started")
    os.makedirs(met, exist_ok=True)
    open(os.path.join(met, str(task.get("trial"))), "w").close()
    while len(os.listdir(met)) < 2 and time.time() < started + 60:
        time.sleep(0.1)
path, tag = os.environ["CLOUD_ML_HP_METRIC_FILE"], os.environ["CLOUD_ML_HP_METRIC_TAG"]
os.makedirs(os.path.dirname(path), exist_ok=True)
for step in (1, 2):
    time.sleep(1.5)
    value = -(args.x - 2) ** 2 - 2 + step
    if args.by_trial:
        value = -10 * int(task["trial"]) + step
    with open(path, "a") as f:
        f.write(json.dumps({"global_step": str(step), tag: str(value),
                            "timestamp": time.time(), "trial": task.get("trial")}) + "\\n")
    if args.by_trial and int(task["trial"]) >= 3:
        time.sleep(120)  # until the tuner stops it early
if args.hang:
    time.sleep(600)
os.makedirs(args.job_dir, exist_ok=True)
with open(os.path.join(args.job_dir, "ran.json"), "w") as f:
    json.dump({"x": args.x, "trial": task.get("trial"), "started": started,
               "ended": time.time(), "env": os.environ.get("CLOUD_ML_TRIAL_ID")}, f)
if args.fail or (args.x == 3 and not args.by_trial):  # by trial: values by trial alone
    print("x=3 is where this trainer fails", file=sys.stderr, flush=True)
    sys.exit(4)
"""
ONE_CPU = "n1-standard-1"


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    with head(str(tmp_path_factory.mktemp("ray")), num_cpus=3) as node:
        yield node


def tuning(tmp_path, machine=ONE_CPU, **hp) -> str:
    path = tmp_path / "hptuning.yaml"
    path.write_text(yaml.safe_dump({"trainingInput": {
        "scaleTier": "CUSTOM", "masterType": machine, "hyperparameters": {
            "goal": "MAXIMIZE", "hyperparameterMetricTag": "score",
            "params": [{"parameterName": "x", "type": "DISCRETE",
                        "discreteValues": [1, 2, 3]}], **hp}}}))
    return str(path)


def submit(capsys, ray_head, tmp_path, job_id, config, *extra, args=()):
    package = write_package(tmp_path / "pkg", TASK)
    return run(capsys, job_id, "--runner", "ray", "--ray-address", ray_head.dashboard,
               "--config", config, "--job-dir", str(tmp_path / "out"),
               "--package-path", package, "--module-name", "fakejob.task", *extra,
               "--", *args)


def test_a_grid_study_runs_its_trials_as_ray_jobs(capsys, ray_head, tmp_path):
    config = tuning(tmp_path, algorithm="GRID_SEARCH", maxTrials=3, maxParallelTrials=2)
    status, out, err = submit(capsys, ray_head, tmp_path, "raytune", config,
                              args=["--meet"])
    assert status == 0, err[-3000:] + out[-3000:]
    record = records.load("raytune")
    assert record.state == records.SUCCEEDED and record.runner == "ray"
    output = record.training_output
    assert output["isHyperparameterTuningJob"] is True
    trials = output["trials"]
    assert len(trials) == 3 and output["completedTrialCount"] == "2"  # succeeded ones
    by_x = {t["hyperparameters"]["x"]: t for t in trials}
    assert trials[0] is by_x["2"]  # best first: -(x-2)^2 is 0 at x=2
    assert by_x["2"]["finalMetric"] == {"trainingStep": "2", "objectiveValue": 0.0}
    assert by_x["1"]["finalMetric"]["objectiveValue"] == -1.0
    assert by_x["3"]["state"] == "FAILED" and "status of 4" in by_x["3"]["errorMessage"]
    runs = {}
    for t in trials:
        ran = json.loads((tmp_path / "out" / t["trialId"] / "ran.json").read_text())
        assert ran["x"] == int(t["hyperparameters"]["x"])
        assert ran["trial"] == ran["env"] == t["trialId"]  # TF_CONFIG and environment
        runs[t["trialId"]] = (ran["started"], ran["ended"])
    overlaps = [sum(1 for s, e in runs.values() if s <= start < e)
                for start, _ in runs.values()]
    assert max(overlaps) == 2, runs  # maxParallelTrials: two at once, never three
    assert record.engine.get("trials") == {}  # no trial's Ray job left running
    assert sorted((r.label, r.state) for r in record.replicas) == [
        (f"{t}/master-replica-0", "EXITED") for t in "123"]  # each trial's, from its log
    assert job_processes("raytune") == []
    status, out, _ = run(capsys, "jobs", "describe", "raytune", "--summarize")
    assert status == 0 and "(2 trials completed; best first)" in out, out
    status, out, _ = run(capsys, "jobs", "stream-logs", "raytune", "--task-name",
                         f"{by_x['1']['trialId']}/master-replica-0")
    assert f"trial {by_x['1']['trialId']} x=1" in out
    assert (tmp_path / "out" / "hptuning" / "optuna-journal.log").exists()


def test_max_failed_trials_ends_the_study(capsys, ray_head, tmp_path):
    config = tuning(tmp_path, algorithm="RANDOM_SEARCH", maxTrials=3,
                    maxParallelTrials=1, maxFailedTrials=1)
    status, out, err = submit(capsys, ray_head, tmp_path, "rayfails", config,
                              args=["--fail"])
    assert status != 0
    record = records.load("rayfails")
    assert record.state == records.FAILED
    assert "1 trial(s) failed, the job's maxFailedTrials" in record.error_message
    assert len(record.training_output["trials"]) == 1  # none started after it
    assert job_processes("rayfails") == []


def test_early_stopping_stops_a_hopeless_trials_ray_job(capsys, ray_head, tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient
    # the grid: three distinct points (a random search may draw a point again, which
    # the study answers from the earlier trial instead of running it)
    config = tuning(tmp_path, algorithm="GRID_SEARCH", maxTrials=3,
                    maxParallelTrials=1, enableTrialEarlyStopping=True)
    status, out, err = submit(capsys, ray_head, tmp_path, "rayprune", config,
                              args=["--by-trial"])
    assert status == 0, err[-3000:] + out[-3000:]
    record = records.load("rayprune")
    assert record.state == records.SUCCEEDED
    trials = {t["trialId"]: t for t in record.training_output["trials"]}
    assert [trials[i]["isTrialStoppedEarly"] for i in "123"] == [False, False, True]
    assert trials["3"]["finalMetric"] == {"trainingStep": "1", "objectiveValue": -29.0}
    assert "stopped early at step 1" in out
    client = JobSubmissionClient(ray_head.dashboard)
    [third] = [j for j in client.list_jobs() if j.metadata.get("mljob_job_id") ==
               "rayprune" and j.metadata.get("mljob_trial_id") == "3"]
    assert third.status == JobStatus.STOPPED  # stopped, not waited out (120 s)
    assert job_processes("rayprune") == []


def test_cancel_stops_every_running_trials_ray_job(capsys, ray_head, tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient
    config = tuning(tmp_path, maxTrials=3, maxParallelTrials=2)
    status, out, err = submit(capsys, ray_head, tmp_path, "rayhang", config, "--async",
                              args=["--hang"])
    assert status == 0, err
    deadline = time.monotonic() + 240
    while True:  # two trials' Ray jobs running, their replica processes started
        status, out, _ = run(capsys, "jobs", "describe", "rayhang")
        running = records.load("rayhang").engine.get("trials") or {}
        if len(running) == 2 and len(job_processes("rayhang")) >= 2:
            break
        assert time.monotonic() < deadline, out
        time.sleep(2)
    assert yaml.safe_load(out)["state"] == "RUNNING"
    status, out, err = run(capsys, "jobs", "cancel", "rayhang")
    assert status == 0, err
    record = records.load("rayhang")
    assert record.state == records.CANCELLED
    assert [t["state"] for t in record.training_output["trials"]] == ["CANCELLED"] * 2
    client = JobSubmissionClient(ray_head.dashboard)
    for submission_id in running.values():
        assert client.get_job_status(submission_id) == JobStatus.STOPPED
    deadline = time.monotonic() + 30
    while job_processes("rayhang") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job_processes("rayhang") == []
    deadline = time.monotonic() + 30  # the study's process ends once it recorded it
    while record.supervisor_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not record.supervisor_alive()


def test_cancel_stops_the_trials_of_a_study_whose_process_died(capsys, ray_head,
                                                               tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient
    config = tuning(tmp_path, maxTrials=2, maxParallelTrials=1)
    status, _, err = submit(capsys, ray_head, tmp_path, "rayorphan", config, "--async",
                            args=["--hang"])
    assert status == 0, err
    deadline = time.monotonic() + 240
    while True:
        record = records.load("rayorphan")
        running = record.engine.get("trials") or {}
        if running and job_processes("rayorphan"):
            break
        assert time.monotonic() < deadline
        time.sleep(1)
    os.kill(record.supervisor_pid, signal.SIGKILL)  # the study's process dies
    os.waitpid(record.supervisor_pid, 0)  # this process started it: reaped here
    [submission_id] = running.values()
    client = JobSubmissionClient(ray_head.dashboard)
    assert client.get_job_status(submission_id) == JobStatus.RUNNING  # the trial goes on
    status, _, err = run(capsys, "jobs", "cancel", "rayorphan")
    assert status == 0, err
    assert records.load("rayorphan").state == records.CANCELLED
    assert client.get_job_status(submission_id) == JobStatus.STOPPED
    deadline = time.monotonic() + 30
    while job_processes("rayorphan") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job_processes("rayorphan") == []


def test_more_trials_at_once_than_the_cluster_holds_is_one_line(capsys, ray_head,
                                                                tmp_path):
    config = tuning(tmp_path, machine="n1-standard-2", maxTrials=3, maxParallelTrials=3)
    status, _, err = submit(capsys, ray_head, tmp_path, "raywide", config)
    assert status != 0
    line = one_error_line(err)
    assert "maxParallelTrials 3 is more trials than the Ray cluster" in line
    assert "lower it to 1" in line and ray_head.dashboard in line
    nothing_written(tmp_path / "out")
