"""The Python API (`submit.api`) drives what the command line drives, with the same
records: a training job submitted, waited for, its logs and resource read, found by a
filter; a failure and a cancel as exceptions; a model's versions; and README's example
run as it is written. The tuning and batch prediction jobs are in the slow step."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from submit import api, logs, resource
from submit import jobs as records
from tests.support.common import ROOT
from tests.support.submit_cli import write_package

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
# fails with status 3, or (--sleep) says it started and sleeps until stopped
TASK = ("import sys, time\nif '--sleep' not in sys.argv:\n    raise SystemExit(3)\n"
        "print('started', flush=True)\ntime.sleep(120)\n")


@pytest.mark.slow
def test_failure_and_cancel_are_exceptions(tmp_path):
    pkg = write_package(tmp_path / "pkg", TASK)
    job = api.submit("api_fail", package_path=pkg, module_name="fakejob.task",
                     job_dir=str(tmp_path / "api_fail"))
    done = subprocess.run([sys.executable, "-m", "submit", "jobs", "wait", "api_fail",
                           "--timeout", "300"], cwd=ROOT, capture_output=True, text=True,
                          timeout=330)  # the command waits as the API does
    with pytest.raises(api.JobFailed, match="job api_fail failed") as raised:
        job.wait(timeout=300)
    assert job.state == "FAILED"
    assert done.returncode == 1 and done.stderr.strip() == f"error: {raised.value}"

    job = api.submit("api_cancel", package_path=pkg, module_name="fakejob.task",
                     job_dir=str(tmp_path / "api_cancel"), args=["--sleep"],
                     region="europe-west1")
    assert job.describe()["trainingInput"]["region"] == "europe-west1"
    with pytest.raises(TimeoutError, match="still"):
        job.wait(timeout=0.1)
    deadline = time.monotonic() + 120
    while not any("started" in line for line in job.logs()):
        assert time.monotonic() < deadline, list(job.logs())
        time.sleep(0.3)
    job.cancel()
    assert job.state == "CANCELLED"
    with pytest.raises(api.JobCancelled):
        job.wait()
    record = records.load("api_cancel")
    from mljob import procs
    assert [r.pid for r in record.replicas if r.pid and procs.pid_alive(r.pid)] == []


def test_mistakes_are_the_clis_errors_as_exceptions(tmp_path):
    with pytest.raises(api.UsageError, match="invalid job id 'my-job'"):
        api.submit("my-job", job_dir=str(tmp_path / "j"))
    with pytest.raises(api.UsageError, match="unknown option 'wrker_count'"):
        api.submit("job1", job_dir=str(tmp_path / "j"), wrker_count=2)
    with pytest.raises(api.JobNotFoundError):
        api.get_job("nothing_here")
    predict = dict(model_dir=str(tmp_path / "m"), input_paths=[str(tmp_path / "*.json")],
                   output_path=str(tmp_path / "out"))
    with pytest.raises(api.UsageError, match="--runner ray does not run batch prediction"):
        api.submit_prediction("p1", runner="ray", **predict)
    with pytest.raises(api.UsageError, match="--image is for --runner"):
        api.submit_prediction("p1", image="r/i:1", **predict)
    with pytest.raises(api.UsageError, match="no batch prediction job takes the option "
                                             "'projct'"):
        api.submit_prediction("p1", runner="vertex", projct="p", **predict)
    # a training option of a prediction runner is not a batch prediction job's
    with pytest.raises(api.UsageError, match="no batch prediction job takes the option "
                                             "'queue'; use one of context, image, "
                                             "namespace, project"):
        api.submit_prediction("p1", runner="kubeflow", queue="q", **predict)
    with pytest.raises(api.UsageError, match="AND and OR side by side"):
        api.list_jobs(filter="state=RUNNING AND state=QUEUED OR jobId:a*")


def test_a_models_versions(tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    (export / "saved_model.pb").write_bytes(b"x")
    model = api.create_model("api_model", base_path=str(tmp_path / "base"),
                             labels={"team": "api"}, regions=["us-central1"])
    v1 = model.create_version("v1", str(export), runtime_version="2.11",
                              machine_type="mls1-c1-m2")
    assert (v1["isDefault"], v1["state"], v1["runtimeVersion"]) == (True, "READY", "2.11")
    model.create_version("v2", str(export))
    model.set_default("v2")
    assert [(v["name"], v["isDefault"]) for v in model.versions()] == [
        ("v1", False), ("v2", True)]
    assert model.describe()["defaultVersion"]["name"] == "v2"
    assert [m.name for m in api.list_models()] == ["api_model"]
    with pytest.raises(api.UsageError, match="has versions; delete them first"):
        model.delete()
    with pytest.raises(api.UsageError, match="not XGBoost"):
        model.create_version("v3", str(export), framework="xgboost")
    model.delete_version("v1")
    assert (tmp_path / "base" / "2" / "saved_model.pb").exists()


def readme_example() -> str:
    text = open(README, encoding="utf-8").read()
    found = re.search(r"<!-- python-api-example -->\s*```python\n(.*?)```", text, re.S)
    assert found, "README's Python API example is gone"
    return found[1]


@pytest.mark.slow
def test_readmes_example_runs_as_written(tmp_path, monkeypatch, capsys):
    """The bundled MLP trained, its curves read, its export deployed and asked."""
    monkeypatch.chdir(tmp_path)
    exec(compile(readme_example(), "README.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == ["SUCCEEDED", "BASIC", "[Job('demo01', state='SUCCEEDED')]"]
    assert out[3] == "[100, 200]"  # eval's loss at each evaluation
    assert out[4] == "7 10"  # the instance's key passed through, ten class scores
    assert api.get_job("demo01").describe()["labels"] == {"team": "demo"}


def test_the_commands_are_the_apis_calls_printed(tmp_path, monkeypatch, capsys):
    """A job through the API, then the commands: the same resource (the API's with its
    numbers as numbers), the same list, the same end, the same one-line errors."""
    monkeypatch.chdir(tmp_path)
    pkg = write_package(tmp_path / "demo", "import sys\nprint('trained with', "
                                          "sys.argv[1:], flush=True)\n")
    job = api.submit("demo01", package_path=pkg, module_name="fakejob.task",
                     job_dir="jobs/demo01", scale_tier="BASIC", args=["--lr", "0.1"],
                     labels={"team": "demo"}, progress=False)
    job.wait()
    assert job.state == "SUCCEEDED"
    assert "trained with ['--lr', '0.1', '--job-dir'" in next(
        line for line in job.logs() if "trained with" in line)
    assert [j.job_id for j in api.list_jobs(filter="labels.team=demo AND state=SUCCEEDED")
            ] == ["demo01"]
    described = job.describe()
    assert described["labels"] == {"team": "demo"} and described["etag"]
    assert api.list_jobs(filter="labels.team=demo AND state!=SUCCEEDED") == []
    with pytest.raises(api.UsageError, match="already ended SUCCEEDED"):
        job.cancel()
    assert list(job.logs(follow=True)) == list(job.logs())  # an ended job: no wait

    def cli(*argv):
        done = subprocess.run([sys.executable, "-m", "submit", *argv], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        return done.returncode, done.stdout, done.stderr.strip()
    status, out, _ = cli("jobs", "describe", "demo01", "--format", "json")
    assert status == 0 and resource.with_numbers(json.loads(out)) == job.describe()
    status, out, _ = cli("jobs", "list", "--filter", "labels.team=demo", "--format", "json")
    assert [resource.with_numbers(j) for j in json.loads(out)] == [
        j.describe() for j in api.list_jobs(filter="labels.team=demo")]
    assert [j["jobId"] for j in json.loads(out)] == ["demo01"]
    assert cli("jobs", "list", "--filter", "state=FAILED", "--format", "json")[:2] == (
        0, "[]\n")
    assert cli("jobs", "wait", "demo01", "--timeout", "30")[:2] == (
        0, "Job [demo01] SUCCEEDED.\n")
    status, _, err = cli("jobs", "cancel", "demo01")
    with pytest.raises(api.UsageError) as raised:
        job.cancel()
    assert status == 2 and err == f"error: {raised.value}"


@pytest.mark.slow
def test_a_tuning_job_and_a_batch_prediction_job_on_a_model_version(tmp_path,
                                                                   monkeypatch):
    """A tuning job (a config given as a dict) and a batch prediction job over a version
    created with the API, each waited for and read back as the commands read it."""
    import json

    from tests.submit.test_tuning_local import TUNE_TASK
    from tests.support.predict_models import images, instance_lines, saved_model_export
    hp = {"goal": "MAXIMIZE", "hyperparameterMetricTag": "score", "maxTrials": 2,
          "maxParallelTrials": 2, "params": [{"parameterName": "x", "type": "DOUBLE",
                                              "minValue": -1.0, "maxValue": 1.0}]}
    tune = api.submit("api_tune", package_path=write_package(tmp_path / "tune", TUNE_TASK),
                      module_name="fakejob.task", job_dir=str(tmp_path / "api_tune"),
                      config={"trainingInput": {"hyperparameters": hp}})

    export = saved_model_export(str(tmp_path / "export"))
    model = api.create_model("api_fashion", base_path=str(tmp_path / "served"))
    model.create_version("v1", export)
    (tmp_path / "in.json").write_text(instance_lines(images(6, seed=3), keys=range(6)))
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)  # a user's default: quiet
    predicted = api.submit_prediction(
        "api_predict", model="api_fashion", version="v1",
        input_paths=[str(tmp_path / "in.json")], output_path=str(tmp_path / "out"))
    predicted.wait(timeout=300)
    output = predicted.describe()["predictionOutput"]
    assert output["predictionCount"] == 6  # a number, as the API gives counts
    assert "trainingInput" not in predicted.describe()
    rows = [json.loads(line) for f in sorted((tmp_path / "out").glob(
        "prediction.results-*")) for line in f.read_text().splitlines()]
    assert sorted(r["key"] for r in rows) == list(range(6))
    # its workers' logs keep TensorFlow's start-up lines out, as training replicas' do
    worker_lines = [line for line in predicted.logs() if "worker-replica-0" in line]
    assert worker_lines and not [line for line in worker_lines
                                 if logs.startup_noise(line.split("\t")[-1])]

    tune.wait(timeout=300)
    trials = tune.describe()["trainingOutput"]["trials"]
    assert len(trials) == 2 and all(t["state"] == "SUCCEEDED" for t in trials)
    assert any(line.startswith("1/") or "score=" in line for line in tune.logs())
