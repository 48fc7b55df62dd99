"""A tuning job as TensorBoard's HParams dashboard sees it: a real `tensorboard` server on
the job dir, asked through the HParams plugin's own HTTP API (what its dashboard asks),
lists the experiment's parameter domains and metric, and each trial's parameter values,
final metric and status, exactly as the job's trainingOutput has them."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest
import yaml

from submit import jobs as records
from tests.support.common import ROOT, free_ports
from tests.support.submit_cli import write_package

TASK = r'''
import os, sys
import hypertune  # the real cloudml-hypertune library
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
x, n = float(args["lr"]), int(args["layers"])
if os.environ["CLOUD_ML_TRIAL_ID"] == os.environ.get("FAIL_TRIAL"):
    sys.exit(3)
for step in (10, 20):
    score = 1.0 - (x - 0.03) ** 2 * 100 + 0.01 * n + (0.1 if args["opt"] == "adam" else 0)
    hypertune.HyperTune().report_hyperparameter_tuning_metric(
        hyperparameter_metric_tag="accuracy", metric_value=score - 0.1 / step,
        global_step=step)
'''
PARAMS = [{"parameterName": "lr", "type": "DOUBLE", "minValue": 0.001, "maxValue": 0.1,
           "scaleType": "UNIT_LOG_SCALE"},
          {"parameterName": "layers", "type": "INTEGER", "minValue": 1, "maxValue": 4},
          {"parameterName": "opt", "type": "CATEGORICAL",
           "categoricalValues": ["adam", "sgd"]},
          {"parameterName": "batch", "type": "DISCRETE", "discreteValues": [16, 32, 64]}]


def tensorboard(reaper, logdir, log_path) -> str:
    port = free_ports(1)[0]
    with open(log_path, "wb") as log:
        proc = reaper.python("-m", "tensorboard.main", "--logdir", str(logdir), "--port",
                             str(port), "--host", "127.0.0.1", "--load_fast", "false",
                             stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + "/data/plugins_listing", timeout=5).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, \
            open(log_path, errors="replace").read()[-2000:]
        time.sleep(0.5)


def ask(url, route, body, timeout=60.0):
    """POST to the HParams plugin as its dashboard does, until the runs are loaded."""
    deadline = time.monotonic() + timeout
    while True:
        answer = httpx.post(f"{url}/data/plugin/hparams/{route}", content=json.dumps(body),
                            headers={"X-XSRF-Protected": "1"}, timeout=30)
        if answer.status_code == 200 and answer.json() and (
                route != "session_groups" or answer.json().get("totalSize", 0) >= 5):
            return answer.json()
        assert time.monotonic() < deadline, (answer.status_code, answer.text[:500])
        time.sleep(1)


@pytest.mark.slow  # kept out of the default run's 15 minutes; CI runs it
def test_tensorboard_hparams_lists_and_compares_the_trials(tmp_path, reaper, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {"hyperparameters": {
        "goal": "MAXIMIZE", "hyperparameterMetricTag": "accuracy", "maxTrials": 4,
        "maxParallelTrials": 2, "params": PARAMS}}}))
    monkeypatch.setenv("FAIL_TRIAL", "4")
    job_dir = tmp_path / "study"
    out = subprocess.run([sys.executable, "-m", "submit", "hp01", "--config", str(config),
                          "--job-dir", str(job_dir), "--package-path",
                          write_package(tmp_path / "pkg", TASK), "--module-name",
                          "fakejob.task"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    trials = {t["trialId"]: t for t in records.load("hp01").training_output["trials"]}
    assert trials["4"]["state"] == "FAILED"

    # a trial still running, as the tuner writes it when it starts: listed, no metric yet
    from submit.jobdef import hparams
    from submit.jobdef.tuning_spec import parse
    spec = parse(yaml.safe_load(config.read_text())["trainingInput"]["hyperparameters"],
                 job_dir=str(job_dir))
    hparams.Board(spec, str(job_dir)).started("5", None, {
        "lr": 0.01, "layers": 2, "opt": "sgd", "batch": 16.0}, time.time())

    url = tensorboard(reaper, job_dir, tmp_path / "tensorboard.log")
    experiment = ask(url, "experiment", {"experimentName": ""})
    infos = {h["name"]: h for h in experiment["hparamInfos"]}
    assert infos["lr"]["domainInterval"] == {"minValue": 0.001, "maxValue": 0.1}
    assert infos["layers"]["type"] == "DATA_TYPE_FLOAT64"
    assert infos["layers"]["domainInterval"] == {"minValue": 1, "maxValue": 4}
    assert infos["opt"]["domainDiscrete"] == ["adam", "sgd"]
    assert infos["batch"]["domainDiscrete"] == [16, 32, 64]
    assert [m["name"]["tag"] for m in experiment["metricInfos"]] == ["accuracy"]

    groups = ask(url, "session_groups", {
        "experimentName": "", "startIndex": 0, "sliceSize": 100,
        "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE",
                            "STATUS_RUNNING"],
        "colParams": [*({"hparam": p["parameterName"], "includeInResult": True}
                        for p in PARAMS),
                      {"metric": {"tag": "accuracy", "group": ""},
                       "includeInResult": True, "order": "ORDER_DESC"}]})
    sessions = {g["name"]: g for g in groups["sessionGroups"]}
    assert sorted(sessions) == ["1", "2", "3", "4", "5"]
    running = sessions.pop("5")
    assert running["hparams"] == {"lr": 0.01, "layers": 2, "opt": "sgd", "batch": 16}
    assert running["sessions"][0]["status"] == "STATUS_UNKNOWN"
    assert not running.get("metricValues")
    for trial_id, group in sessions.items():
        trial = trials[trial_id]
        session = group["sessions"][0]
        assert session["name"] == trial_id  # the trial's own folder is its run
        hp = group["hparams"]
        assert f"{hp['lr']:.6g}" == f"{float(trial['hyperparameters']['lr']):.6g}"
        assert hp["layers"] == int(trial["hyperparameters"]["layers"])
        assert hp["opt"] == trial["hyperparameters"]["opt"]
        assert hp["batch"] == float(trial["hyperparameters"]["batch"])
        if trial["state"] == "SUCCEEDED":
            assert session["status"] == "STATUS_SUCCESS"
            metric = group["metricValues"][0]
            assert metric["name"]["tag"] == "accuracy"
            assert abs(metric["value"] - trial["finalMetric"]["objectiveValue"]) < 1e-6
            assert metric["trainingStep"] == 20
        else:
            assert session["status"] == "STATUS_FAILURE"
            assert not group.get("metricValues")
    # best first by the metric, as the dashboard sorts it: the job's own ranking
    succeeded = [t for t in records.load("hp01").training_output["trials"]
                 if t["state"] == "SUCCEEDED"]
    assert [g["name"] for g in groups["sessionGroups"]][:3] == \
        [t["trialId"] for t in succeeded]
