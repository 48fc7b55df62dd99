"""A tuning job on `--runner ray`, the parts that need no cluster: the dry run (the
study's plan and the trial's Ray job), a trial's job (flags, job dir, TF_CONFIG's trial,
relayed reports), how many trials a cluster holds at once, a replica's reports read on
its node (a real process), and a trial's Ray log taken apart into the trial's log files
and metrics file. The study on a real Ray head is tests/e2e/test_ray_tuning_e2e.py."""
from __future__ import annotations

import json
import os
import time
import types

import pytest
import yaml

from mljob import contracts, hypertune
from submit import logs
from tests.support.ray_cluster import skip_reason
from tests.support.submit_cli import dry_run

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")
ray_tuning = pytest.importorskip("submit.runners.ray_tuning")
from submit.runners import ray as rayrunner, ray_driver  # noqa: E402

ADDRESS = "http://10.0.0.5:8265"
GIB = 1024 ** 3
HP = {"goal": "MINIMIZE", "hyperparameterMetricTag": "loss", "maxTrials": 4,
      "maxParallelTrials": 2, "params": [
          {"parameterName": "lr", "type": "DOUBLE", "minValue": 0.001, "maxValue": 0.1,
           "scaleType": "UNIT_LOG_SCALE"}]}


def test_the_dry_run_is_the_study_and_its_trials_ray_job(capsys, tmp_path, pkg):
    config = tmp_path / "hp.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {"hyperparameters": HP}}))
    out = dry_run(capsys, "tune01", "--runner", "ray", "--ray-address", ADDRESS,
                  "--config", str(config), "--package-path", pkg,
                  "--job-dir", str(tmp_path / "out"), "--", "--epochs", "2")
    plan, trial = out["plan"], out["trial"]
    assert plan["tuning"]["max_parallel_trials"] == 2 and plan["tuning"]["goal"] == \
        "MINIMIZE"
    assert plan["replica_job_dir"] == str(tmp_path / "out")
    assert plan["log_dir"] == str(tmp_path / "out" / "logs")
    assert trial["address"] == ADDRESS
    assert trial["job"]["args"] == ["--epochs", "2", "--job-dir", str(tmp_path / "out")]
    assert not os.path.exists(tmp_path / "out")  # a dry run writes nothing


def base_body(job_dir="gs://bkt/tune01") -> dict:
    return {"address": ADDRESS, "metadata": {"mljob_job_id": "tune01"}, "job": {
        "job_id": "tune01", "args": ["--epochs", "2", "--job-dir", job_dir],
        "env": {contracts.JOB_ID_ENV: "tune01"}, "replicas": []}}


@pytest.mark.parametrize("job_dir,trial_dir", [
    ("gs://bkt/tune01", "gs://bkt/tune01/3"), ("/shared/tune01", "/shared/tune01/3")])
def test_a_trials_ray_job(job_dir, trial_dir):
    base = base_body(job_dir)
    body = ray_tuning.trial_body(base, "3", ["--lr=0.01"], "loss", job_dir)
    job = body["job"]
    assert job["args"] == ["--epochs", "2", "--lr=0.01", "--job-dir", trial_dir]
    assert job["trial"] == "3" and job["job_id"] == "tune01-trial-3"
    assert job["hp_metric_file"] == ray_tuning.METRIC_FILE
    assert job["env"] == {contracts.JOB_ID_ENV: "tune01",  # the job's id, as on Cloud ML
                          contracts.TRIAL_ID_ENV: "3", contracts.HP_METRIC_TAG_ENV: "loss"}
    assert body["metadata"] == {"mljob_job_id": "tune01", "mljob_trial_id": "3"}
    assert base == base_body(job_dir)  # the study's template is untouched


def test_how_many_trials_a_cluster_holds_at_once():
    one_cpu = {"CPU": 1.0, "memory": 3.75 * GIB}
    head = {"CPU": 3.0, "memory": 16.0 * GIB}
    assert ray_tuning.max_trials_at_once([one_cpu], [head], 5) == 3
    assert ray_tuning.max_trials_at_once([one_cpu], [head], 2) == 2
    assert ray_tuning.max_trials_at_once([one_cpu, one_cpu], [head, head], 4) == 3
    assert ray_tuning.max_trials_at_once([{"CPU": 1.0, "GPU": 1.0}], [head], 2) == 0


def test_a_replicas_reports_are_read_on_its_node(tmp_path, monkeypatch):
    """The actor gives its replica a metrics file under the replica's folder and reads
    its report lines back; the driver's relayed line parses to them."""
    module = tmp_path / "src" / "reporter.py"
    module.parent.mkdir()
    module.write_text("import os, json\n"
                      "path = os.environ['CLOUD_ML_HP_METRIC_FILE']\n"
                      "os.makedirs(os.path.dirname(path), exist_ok=True)\n"
                      "open(path, 'w').write(json.dumps({'global_step': '5', "
                      "'loss': '0.25'}) + '\\n')\n")
    monkeypatch.chdir(tmp_path)
    actor = ray_driver.ReplicaActor("master-replica-0")
    assert actor.metrics() == []
    actor.start("reporter", [], {"PYTHONPATH": str(module.parent)},
                "replicas/master-replica-0", ray_tuning.METRIC_FILE)
    deadline = time.monotonic() + 30
    while actor.poll()[1] is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert actor.metric_file == str(tmp_path / "replicas" / "master-replica-0" /
                                    ray_tuning.METRIC_FILE)
    [line] = actor.metrics()
    assert json.loads(line) == {"global_step": "5", "loss": "0.25"}
    relayed = ray_driver.log_line("service", f"{ray_driver.METRIC}master-replica-0 {line}")
    assert rayrunner.parse_metric(relayed) == ("master-replica-0", line)
    assert rayrunner.parse_metric(ray_driver.log_line("service", "replica x state=R")) \
        is None
    assert ray_driver.HP_METRIC_FILE_ENV == contracts.HP_METRIC_FILE_ENV


def test_a_trials_ray_log_is_split_into_its_logs_and_metrics(tmp_path):
    changed = []
    tuner = types.SimpleNamespace(plan=types.SimpleNamespace(log_dir=str(tmp_path / "logs"),
                                                             job_id="tune01"),
                                  terminal=logs.Terminal(stream=False),
                                  _trial_changed=changed.append)
    metric_file = str(tmp_path / "run" / "trials" / "3" / "output.metrics")
    trial = ray_tuning.RayTrial(tuner, "3", base_body(), metric_file, None)
    report = json.dumps({"global_step": "10", "loss": "0.5", "timestamp": 1.0})
    lines = [ray_driver.log_line("master-replica-0", "step 10 loss=0.5"),
             ray_driver.log_line("service", f"{ray_driver.METRIC}master-replica-0 {report}"),
             ray_driver.log_line("service", "replica master-replica-0 state=RUNNING "
                                 "restarts=0 exit=- node=10.0.0.2")]
    text = "\n".join(lines) + "\n" + "2026-11-27 INFO worker.py -- Ray's own\nhalf"
    trial._take(text, final=False)
    trial._take(text + " a line", final=False)  # the report again: taken once
    assert [r.value for r in hypertune.read_reports(metric_file, "loss")] == [0.5]
    master = (tmp_path / "logs" / "3" / "master-replica-0.log").read_text().splitlines()
    assert [line.split("\t")[2:] for line in master] == [["3/master-replica-0",
                                                         "step 10 loss=0.5"]]
    service = (tmp_path / "logs" / "3" / "service.log").read_text()
    assert "3/service\treplica master-replica-0 state=RUNNING" in service
    assert "Ray's own" in service and "half" not in service  # an unfinished line waits
    trial._take(text + " a line", final=True)
    assert "half a line" in (tmp_path / "logs" / "3" / "service.log").read_text()
    assert hypertune.read_reports(metric_file, "loss")[0].step == 10
    assert changed == []  # replicas come from the status, not the log's copy
    from submit.runners.engine import ReplicaStatus
    running = (ReplicaStatus("master-replica-0", "RUNNING"),)
    trial._replicas(running)
    trial._replicas(running)  # the same again: the record is not written again
    trial._replicas((ReplicaStatus("master-replica-0", "EXITED", 0),))
    assert len(changed) == 2  # RUNNING once, then EXITED
    assert [(r.label, r.state) for r in changed[-1].replicas] == \
        [("3/master-replica-0", "EXITED")]


def test_a_studys_logs_name_its_trials_replicas(tmp_path):
    """The study's logs are the local tuner's files; a task name that names none of its
    trials' replicas is one line naming the trial/replica form."""
    from submit.errors import UsageError
    from submit.runners import ray_tuning
    logs = os.path.join(os.environ["MLJOB_HOME"], "runs", "study01", "logs")  # its own
    folder = os.path.join(logs, "1")
    os.makedirs(folder)
    with open(os.path.join(folder, "master-replica-0.log"), "w") as f:
        f.write("INFO\tt\t1/master-replica-0\thello\n")
    index = os.path.join(os.environ["MLJOB_HOME"], "jobs")
    os.makedirs(index, exist_ok=True)
    with open(os.path.join(index, "study01.json"), "w") as f:
        json.dump({"job_id": "study01", "state": "SUCCEEDED",
                   "log_dir": logs,
                   "replicas": [{"label": "1/master-replica-0", "state": "EXITED"}]}, f)
    from submit.runners.engine import EngineOptions
    runner = ray_tuning.RayTuningEngine(EngineOptions())
    with pytest.raises(UsageError, match=r"--task-name 'chief-0' names no replica of job "
                                         r"study01; use a trial's replica .*1/master-"
                                         r"replica-0\), or service$"):
        runner.logs({"job_id": "study01"}, task_name="chief-0", follow=False)
    lines = list(runner.logs({"job_id": "study01"}, task_name="1/master-replica-0",
                             follow=False))
    assert any("hello" in line for line in lines)
