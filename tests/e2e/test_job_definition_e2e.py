"""Issue 13's first showing, end to end through `python -m submit`: a CUSTOM cluster from
gcloud's flags alone (no config file) with `--labels`, run by the local runner with the
real trainer (chief, two workers and a ps as TensorFlow processes on 127.0.0.1) to
SUCCEEDED, the labels in `jobs describe`; then the same command line rendered by
`--runner kubeflow --dry-run` and `--runner vertex --dry-run`, the labels in the TFJob and
the CustomJob."""
from __future__ import annotations

import pytest

import json
import subprocess

import yaml

from mljob.procs import pid_alive
from submit import jobs as records
from tests.support.common import ROOT
from tests.support.trainer_runs import SAMPLE

CUSTOM = ["--scale-tier", "CUSTOM", "--master-machine-type", "n1-standard-4",
          "--worker-count", "2", "--parameter-server-count", "1", "--labels", "team=vision"]
TRAIN = ["--model", "mlp", "--data-dir", SAMPLE, "--train-steps", "20", "--batch-size", "32",
         "--seed", "1"]
REPLICAS = ["master-replica-0", "worker-replica-0", "worker-replica-1", "ps-replica-0"]


def submit(reaper, tmp_path, name: str, *argv, timeout: float = 60) -> tuple[int, str, str]:
    """`python -m submit ARGV`, started by the reaper (stopped by its PID if the test
    fails), output in files; (exit status, stdout, stderr)."""
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = reaper.python("-m", "submit", *argv, stdout=o, stderr=e, cwd=ROOT)
    try:
        status = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"submit {name} still running after {timeout}s\n"
                             f"{err.read_text()[-3000:]}") from None
    return status, out.read_text(), err.read_text()


@pytest.mark.slow  # long: CI runs it in the slow step
def test_custom_from_flags_with_labels_runs_to_succeeded(reaper, tmp_path):
    job_dir = str(tmp_path / "job")
    status, out, err = submit(reaper, tmp_path, "local", "job", *CUSTOM, "--job-dir",
                              job_dir, "--", *TRAIN, timeout=400)
    assert status == 0, err[-3000:]
    assert "Job [job] SUCCEEDED." in out
    record = records.load("job")
    assert record.state == records.SUCCEEDED, record.error_message
    assert record.labels == {"team": "vision"}
    assert sorted(r.label for r in record.replicas) == sorted(REPLICAS)
    assert [r.label for r in record.replicas if pid_alive(r.pid)] == []
    master_log = (tmp_path / "job" / "logs" / "master-replica-0.log").read_text()
    assert "\tmaster-replica-0\ttraining started: strategy=ps" in master_log
    assert "\tmaster-replica-0\tstep 20/20 loss=" in master_log
    assert (tmp_path / "job" / "model" / "saved_model.pb").exists()

    status, out, err = submit(reaper, tmp_path, "describe", "jobs", "describe", "job")
    assert status == 0, err
    described = yaml.safe_load(out)
    assert described["labels"] == {"team": "vision"}
    assert "state: SUCCEEDED" in out


def test_the_same_command_line_renders_the_labels_for_each_engine(reaper, tmp_path):
    """The engines need a gs:// job dir; a dry run touches nothing remote and records
    nothing."""
    gs = ["--job-dir", "gs://mljob-test/jobdef/job", *CUSTOM]
    status, out, err = submit(reaper, tmp_path, "kubeflow", "job", *gs, "--runner",
                              "kubeflow", "--namespace", "ml", "--image", "img:1",
                              "--dry-run", "--", *TRAIN)
    assert status == 0, err
    tfjob = yaml.safe_load(out)
    assert tfjob["kind"] == "TFJob"
    assert tfjob["metadata"]["labels"]["team"] == "vision"
    specs = tfjob["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Chief": 1, "Worker": 2, "PS": 1}
    for kind, replica in specs.items():
        assert replica["template"]["metadata"]["labels"]["team"] == "vision", kind
        assert replica["template"]["spec"]["containers"][0]["args"][:2] == ["--model", "mlp"]

    status, out, err = submit(reaper, tmp_path, "vertex", "job", *gs, "--runner", "vertex",
                              "--project", "my-project-123", "--dry-run", "--", *TRAIN)
    assert status == 0, err
    custom_job = json.loads(out)["customJob"]
    assert custom_job["labels"]["team"] == "vision"
    pools = custom_job["jobSpec"]["workerPoolSpecs"]
    assert [p.get("replicaCount") for p in pools] == ["1", "2", "1"]
    assert pools[0]["machineSpec"]["machineType"] == "n1-standard-4"
    status, out, err = submit(reaper, tmp_path, "list", "jobs", "list")
    assert status == 0 and out.splitlines()[1:] == [], out  # only the header
