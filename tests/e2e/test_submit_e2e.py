"""Whole jobs with the real trainer (`trainer.task`, TensorFlow processes talking gRPC on
127.0.0.1): STANDARD_1 on a local job dir, a CUSTOM config.yaml job with an evaluator on
memory://, BASIC on the GCS emulator. Each trains the MLP for a few steps, checkpoints,
exports, reaches SUCCEEDED, and leaves no replica alive. STANDARD_1 (8 TensorFlow
processes) is heavy on this machine, so it runs once by default; its gs:// and memory://
variants are marked slow."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.support.common import ROOT, pid_alive
from submit import jobs as records
from submit.__main__ import main

TRAIN = ["--model", "mlp", "--train-steps", "40", "--batch-size", "32"]
STANDARD_1 = ["master-replica-0"] + [f"worker-replica-{i}" for i in range(4)] + \
    [f"ps-replica-{i}" for i in range(3)]


def submit_cli(*argv, timeout=400):
    return subprocess.run([sys.executable, "-m", "submit", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def check_finished(record: records.JobRecord, labels: list[str]) -> None:
    assert record.state == records.SUCCEEDED, record.error_message
    assert sorted(r.label for r in record.replicas) == sorted(labels)
    pids = [r.pid for r in record.replicas]
    assert len(set(pids)) == len(labels) and all(pids)  # one process per replica
    assert [p for p in pids if pid_alive(p)] == []
    assert {r.label: r.exit_code for r in record.replicas}["master-replica-0"] == 0


def check_job_dir(files: set[str], labels: list[str]) -> None:
    """files: paths relative to the job dir."""
    assert "checkpoints/checkpoint" in files
    assert any(f.startswith("checkpoints/ckpt-40.index") for f in files)
    assert "model/saved_model.pb" in files
    assert any(f.startswith("summaries/train/") for f in files)
    for label in labels:
        assert f"logs/{label}.log" in files


def local_files(root) -> set[str]:
    return {os.path.relpath(os.path.join(d, n), root) for d, _, names in os.walk(root)
            for n in names}


@pytest.mark.slow  # long: CI runs it in the slow step
def test_standard_1_on_a_local_job_dir(tmp_path):
    job_dir = str(tmp_path / "job01")
    out = submit_cli("job01", "--scale-tier", "STANDARD_1", "--job-dir", job_dir, "--",
                     *TRAIN)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Job [job01] SUCCEEDED." in out.stdout
    record = records.load("job01")
    check_finished(record, STANDARD_1)
    check_job_dir(local_files(job_dir), STANDARD_1)
    master_log = open(os.path.join(job_dir, "logs", "master-replica-0.log")).read()
    assert "\tmaster-replica-0\ttraining started: strategy=ps" in master_log
    assert "\tmaster-replica-0\tstep 40/40 loss=" in master_log
    assert f"exported model to {job_dir}/model" in master_log
    assert "\tps-replica-2\t" in open(os.path.join(job_dir, "logs", "ps-replica-2.log")).read()
    # the trainer got --job-dir as Cloud ML passes it, and ran from the staged package
    assert record.trainer_args == TRAIN + ["--job-dir", job_dir]
    assert record.package_url.startswith(f"{job_dir}/packages/{record.package_sha256}/")
    with open(os.path.join(job_dir, "jobs", "job01.json")) as f:
        assert json.load(f)["state"] == "SUCCEEDED"
    described = submit_cli("jobs", "describe", "job01", timeout=60)
    assert described.returncode == 0
    assert f"tensorboard --logdir {job_dir}" in described.stderr  # hints: stderr
    assert yaml.safe_load(described.stdout)["state"] == "SUCCEEDED"
    again = submit_cli("job01", "--job-dir", job_dir, timeout=60)
    assert again.returncode == 2 and "already used in" in again.stderr


@pytest.mark.slow  # long: CI runs it in the slow step
def test_custom_config_with_an_evaluator_on_memory(capsys, tmp_path, memfs):
    config = tmp_path / "config.yaml"
    config.write_text("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
                      "  workerType: standard\n  parameterServerType: standard\n"
                      "  workerCount: 1\n  parameterServerCount: 1\n  evaluatorCount: 1\n"
                      f"  args: {json.dumps(TRAIN)}\n")
    status = main(["job02", "--config", str(config), "--job-dir", "memory://bucket/job02"],
                  standalone_mode=False)
    out, err = capsys.readouterr()
    assert status == 0, err[-3000:]
    labels = ["master-replica-0", "worker-replica-0", "ps-replica-0", "evaluator-replica-0"]
    check_finished(records.load("job02"), labels)
    files = {os.path.relpath(f, "/bucket/job02") for f in memfs.find("/bucket/job02")}
    check_job_dir(files, labels)
    assert any(f.startswith("summaries/eval/") for f in files)
    assert "jobs/job02.json" in files
    assert json.loads(memfs.cat_file("/bucket/job02/jobs/job02.json"))["state"] == \
        "SUCCEEDED"
    evaluator_log = memfs.cat_file("/bucket/job02/logs/evaluator-replica-0.log").decode()
    assert "\tevaluator-replica-0\t" in evaluator_log


def test_basic_on_the_gcs_emulator(tmp_path, gcs_emulator):
    from mljob import storage
    job_dir, staging = "gs://mljob-test/e2e/job03", "gs://mljob-test/staging"
    out = submit_cli("job03", "--job-dir", job_dir, "--staging-bucket", staging, "--",
                     *TRAIN)
    assert out.returncode == 0, out.stderr[-3000:]
    record = records.load("job03")
    check_finished(record, ["master-replica-0"])
    assert record.package_url == \
        f"{staging}/job03/{record.package_sha256}/mljob-0.1.0.tar.gz"
    fs, root = storage.filesystem(job_dir)
    fs.invalidate_cache()
    files = {os.path.relpath(f, root) for f in fs.find(root)}
    check_job_dir(files, ["master-replica-0"])
    assert json.loads(fs.cat_file(f"{root}/jobs/job03.json"))["state"] == "SUCCEEDED"
    assert storage.exists(record.package_url)


@pytest.mark.slow
def test_standard_1_on_the_gcs_emulator(gcs_emulator):
    from mljob import storage
    job_dir = "gs://mljob-test/e2e/job04"
    out = submit_cli("job04", "--scale-tier", "STANDARD_1", "--job-dir", job_dir,
                     "--staging-bucket", "gs://mljob-test/staging", "--", *TRAIN)
    assert out.returncode == 0, out.stderr[-3000:]
    check_finished(records.load("job04"), STANDARD_1)
    fs, root = storage.filesystem(job_dir)
    fs.invalidate_cache()
    check_job_dir({os.path.relpath(f, root) for f in fs.find(root)}, STANDARD_1)


@pytest.mark.slow
def test_standard_1_on_memory(capsys, memfs):
    status = main(["job05", "--scale-tier", "STANDARD_1", "--job-dir",
                   "memory://bucket/job05", "--", *TRAIN], standalone_mode=False)
    _, err = capsys.readouterr()
    assert status == 0, err[-3000:]
    check_finished(records.load("job05"), STANDARD_1)
    files = {os.path.relpath(f, "/bucket/job05") for f in memfs.find("/bucket/job05")}
    check_job_dir(files, STANDARD_1)
