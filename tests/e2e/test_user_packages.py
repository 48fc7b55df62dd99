"""Users' own packages submitted as Cloud ML ran them: a TF1-style `trainer/` folder with
no setup.py on a STANDARD_1 cluster staged to gs://, and a package whose dependency
pip installs from the index into an environment the next job reuses."""
from __future__ import annotations

import importlib.util
import re
import time

import pytest

from mljob.procs import pid_alive
from submit import jobs as records
from tests.support.submit_cli import run as submit_in_process
from tests.support.user_packages import write_package_with_requirement, write_tf1_trainer


@pytest.mark.slow
def test_a_tf1_style_trainer_package_runs_as_the_samples_submitted_it(
        capsys, tmp_path, monkeypatch, gcs_emulator):
    import fsspec
    monkeypatch.chdir(write_tf1_trainer(str(tmp_path / "project")))
    bucket = "gs://mljob-test"
    status, out, err = submit_in_process(
        capsys, "job01", "--package-path=trainer", "--module-name=trainer.task",
        f"--staging-bucket={bucket}", "--region=us-central1", "--config=config.yaml", "--",
        f"--log_dir={bucket}/job01/train", f"--model_dir={bucket}/job01/model",
        "--max_steps=200")
    assert status == 0, err + out[-3000:]
    record = records.load("job01")
    assert record.state == records.SUCCEEDED
    assert record.training_input["region"] == "us-central1"
    assert record.package_url.startswith(f"{bucket}/job01/{record.package_sha256}/")
    assert record.package_url.endswith("/trainer-0.0.0.tar.gz")
    labels = sorted(r.label for r in record.replicas)
    assert labels == ["master-replica-0", *(f"ps-replica-{i}" for i in range(3)),
                      *(f"worker-replica-{i}" for i in range(4))]
    for replica in record.replicas:  # nothing of the job is left
        assert replica.pid and not pid_alive(replica.pid), replica.label
    by_label = {r.label: r for r in record.replicas}
    for i in range(3):  # each ps was in server.join() until the runner stopped it
        assert by_label[f"ps-replica-{i}"].state == "STOPPED"
        assert f"ps-replica-{i}\tps {i}: serving; server.join()" in out
    assert re.search(r"master-replica-0\tmaster 0: step \d+ loss \d", out)
    assert f"master-replica-0\texported to {bucket}/job01/model" in out
    fs = fsspec.filesystem("gs")
    assert fs.exists("mljob-test/job01/model/saved_model.pb")
    assert fs.ls("mljob-test/job01/model/variables")
    assert any(p.endswith(".index") for p in fs.ls("mljob-test/job01/train"))


@pytest.mark.slow
def test_install_requires_are_installed_once_and_reused(capsys, tmp_path, monkeypatch):
    module = "tabulate"
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is already in the base environment")
    monkeypatch.setenv("MLJOB_ENV_CACHE", str(tmp_path / "envs"))
    pkg = write_package_with_requirement(str(tmp_path / "pkg"), "tabulate>=0.9", module)
    args = ["--package-path", pkg, "--module-name", "tablejob.task"]
    took = []
    for job in ("first", "second"):
        started = time.monotonic()
        status, out, err = submit_in_process(capsys, job, "--job-dir",
                                             str(tmp_path / job), *args)
        took.append(time.monotonic() - started)
        assert status == 0, err + out[-3000:]
        assert f"master-replica-0\timported {module} from {tmp_path / 'envs'}" in out
        assert ("created" if job == "first" else "reused") in \
            [line for line in out.splitlines() if "package environment" in line][-1]
    print(f"\nsubmit with a pip install: {took[0]:.1f} s; reusing it: {took[1]:.1f} s")
    # the base environment still lacks it: it went into the package's environment only
    assert importlib.util.find_spec(module) is None
