"""Custom containers on the local runner, for real: podman runs every replica of a job in
an image built here. The base image (`localhost/mljob-base:TAG`, Debian's packages and
pip's wheels, `submit.local.image_build`) is built once and kept; the job image is
this project's sdist installed on it by the Kubeflow runner's own Dockerfile (so that
Dockerfile is tested by building it), rebuilt when the sources change.

A ps job shaped like STANDARD_1 (master, worker, ps) runs to SUCCEEDED with its export
in the job dir, though its worker's container is killed (`podman kill`) mid-run and
restarted under OnFailure; `jobs cancel` of a running job stops the replicas in the stop
reaches the trainer in its container (it saves and exits 143) and leaves no container
and no network; a command that exits at once fails the
job; an engine that cannot start containers (a ulimit or cgroup setting it cannot apply)
is refused in one line. Skipped, with the reason, where podman is not installed.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
import yaml

from submit import jobs as records
from submit.local import container_engine as ce
from submit.local import image_build
from submit.runners import images
from tests.support.submit_cli import one_error_line, run

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("podman") is None,
                                 reason="podman is not installed (.ci/setup installs it)")]

ONE_CPU = "n1-standard-1"
TASK = ["python", "-m", "trainer.task"]
TRAIN = ["--model", "mlp", "--seed", "1", "--checkpoint-every", "0", "--eval-every", "0",
         "--log-every", "100", "--steps-per-execution", "10"]


def config(tmp_path, image: str, *, command=TASK, policy="Never") -> str:
    replica = {"containerCommand": command, "restartPolicy": policy, "maxRestarts": 2}
    body = {"trainingInput": {
        "scaleTier": "CUSTOM", "masterType": ONE_CPU, "workerType": ONE_CPU,
        "parameterServerType": ONE_CPU, "workerCount": 1, "parameterServerCount": 1,
        "masterConfig": {**replica, "imageUri": image}, "workerConfig": replica,
        "parameterServerConfig": replica}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


@pytest.fixture(scope="module")
def engine():
    return ce.detect("podman")


@pytest.fixture(scope="module")
def image(engine):
    started = time.monotonic()
    base = image_build.base_image(engine)
    built = images.package_image(engine, None, None, base)
    # earlier sources' images of this project go (each run of changed sources builds one)
    tags = subprocess.run([engine.path, "images", "--format", "{{.Repository}}:{{.Tag}}",
                           "--filter", "reference=localhost/mljob"], capture_output=True,
                          text=True).stdout.split()
    stale = [t for t in tags if t != built]
    if stale:
        subprocess.run([engine.path, "rmi", *stale], capture_output=True)
    print(f"images {base} and {built} ready in {time.monotonic() - started:.0f} s")
    return built


def wait_record(job_id: str, ready, timeout: float, what: str) -> records.JobRecord:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            record = records.load(job_id)
        except Exception:  # not written yet
            record = None
        if record is not None and ready(record):
            return record
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def log_has(job_dir, label: str, text: str) -> bool:
    try:
        with open(os.path.join(job_dir, "logs", f"{label}.log"), errors="replace") as f:
            return text in f.read()
    except OSError:
        return False


def test_a_ps_job_in_containers_survives_a_killed_worker(capsys, engine, image, tmp_path):
    job_dir = tmp_path / "out"
    status, out, err = run(capsys, "cps", "--config",
                           config(tmp_path, image, policy="OnFailure"), "--job-dir",
                           str(job_dir), "--async", "--", *TRAIN, "--train-steps", "3000")
    assert status == 0, err
    # the chief trains on the worker: kill the worker's container as a machine's loss would
    wait_record("cps", lambda r: r.done or log_has(job_dir, "master-replica-0", "step 1/"),
                300, "the chief's first steps")
    worker = ce.container_name("cps", "worker-replica-0")
    subprocess.run([engine.path, "kill", worker], check=True, capture_output=True)
    record = wait_record("cps", lambda r: r.done, 300, "the job's end")
    assert record.state == records.SUCCEEDED, record.error_message
    assert (job_dir / "model" / "saved_model.pb").exists()
    replicas = {r.label: r for r in record.replicas}
    assert replicas["worker-replica-0"].restarts == 1
    assert replicas["worker-replica-0"].exit_codes[0] == 137   # killed, then restarted
    assert replicas["master-replica-0"].exit_code == 0
    status, out, err = run(capsys, "jobs", "describe", "cps")
    assert status == 0, err
    assert "worker-replica-0: " in err and "1 restart; exit status of each run: 137" in err
    # the chief may itself have failed on its worker's loss (exit 200) and been restarted
    assert "master-replica-0: " in err and "exit status of each run: " in err
    assert ce.leftovers(engine, "cps") == ([], [])
    # each replica's figures are its container's (TensorFlow's hundreds of MiB), not the
    # engine client's
    assert sorted(record.usage) == ["master-replica-0", "ps-replica-0", "worker-replica-0"]
    assert all(u["memoryPeakMiB"] > 150 for u in record.usage.values()), record.usage
    service = (job_dir / "logs" / "service.log").read_text()
    assert "containers run by podman" in service and "on network mljob-cps" in service


def test_cancel_stops_the_chief_so_it_saves_and_leaves_nothing(capsys, engine, image,
                                                               tmp_path):
    """A job of one replica (the stop order across replica types is the supervisor's,
    the same for containers: tests/submit/test_stop_order.py): `jobs cancel`'s SIGTERM
    reaches the trainer in its container, which saves and exits 143."""
    job_dir = tmp_path / "out"
    path = tmp_path / "basic.yaml"
    path.write_text(yaml.safe_dump({"trainingInput": {"scaleTier": "BASIC", "masterConfig": {
        "imageUri": image, "containerCommand": TASK}}}))
    status, _, err = run(capsys, "ccan", "--config", str(path), "--job-dir", str(job_dir),
                         "--async", "--", *TRAIN, "--train-steps", "1000000")
    assert status == 0, err
    wait_record("ccan", lambda r: r.done or log_has(job_dir, "master-replica-0", "step 1/"),
                300, "the chief's first steps")
    names, nets = ce.leftovers(engine, "ccan")
    assert names == ["mljob-ccan-master-replica-0"] and nets == ["mljob-ccan"]
    status, out, err = run(capsys, "jobs", "cancel", "ccan")
    assert status == 0, err
    record = wait_record("ccan", lambda r: r.done, 120, "the cancel")
    assert record.state == records.CANCELLED
    assert record.replicas[0].exit_code == 143   # the trainer's own exit on SIGTERM
    assert "checkpoint saved" in (job_dir / "logs" / "master-replica-0.log").read_text()
    assert ce.leftovers(engine, "ccan") == ([], [])


def test_a_command_that_exits_at_once_fails_the_job(capsys, engine, image, tmp_path):
    status, out, err = run(capsys, "cfalse", "--config",
                           config(tmp_path, image, command=["false"]), "--job-dir",
                           str(tmp_path / "out"))
    assert status != 0
    assert "exited with a non-zero status of 1" in err.strip().splitlines()[-1]
    assert ce.leftovers(engine, "cfalse") == ([], [])


@pytest.mark.parametrize("conf,words", [
    ('[containers]\ndefault_ulimits = ["nofile=99999999:99999999"]\n',
     "set `default_ulimits = []`"),
    ('[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "systemd"\n',
     "set `cgroup_manager = \"cgroupfs\"`"),
])
def test_an_engine_that_cannot_start_containers_is_one_line(capsys, monkeypatch, image,
                                                            tmp_path, conf, words):
    path = tmp_path / "containers.conf"
    path.write_text(conf)
    monkeypatch.setenv("CONTAINERS_CONF", str(path))
    status, out, err = run(capsys, "cbad", "--master-image-uri", image, "--job-dir",
                           str(tmp_path / "out"))
    assert status == 2 and out == ""
    line = one_error_line(err)
    assert "podman cannot start containers here" in line and words in line
    assert not (tmp_path / "out").exists()


def test_build_image_runs_a_user_package_with_its_dependency(capsys, engine, image,
                                                             tmp_path):
    """`--build-image`: a user's package whose setup.py requires a distribution the base
    lacks (tabulate, from PyPI) built into an image by the Kubeflow runner's Dockerfile,
    and the job run in it to SUCCEEDED, writing its job dir."""
    pkg = tmp_path / "pkg"
    (pkg / "tabjob").mkdir(parents=True)
    (pkg / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='tabjob', version='0.1', "
        "packages=['tabjob'], install_requires=['tabulate>=0.9'])\n")
    (pkg / "tabjob" / "__init__.py").write_text("")
    (pkg / "tabjob" / "task.py").write_text(
        "import os, sys, tabulate\n"
        "job_dir = sys.argv[sys.argv.index('--job-dir') + 1]\n"
        "os.makedirs(job_dir, exist_ok=True)\n"
        "open(os.path.join(job_dir, 'table.txt'), 'w').write(tabulate.tabulate([[1, 2]]))\n"
        "print('tabulate', tabulate.__version__, os.environ['CLOUD_ML_JOB_ID'])\n")
    name = f"localhost/tabjob:{os.getpid()}"
    try:
        status, out, err = run(capsys, "ctab", "--package-path", str(pkg), "--module-name",
                               "tabjob.task", "--build-image", name, "--base-image",
                               image_build.base_image(engine), "--job-dir",
                               str(tmp_path / "out"))
        assert status == 0, err[-2000:]
        assert "Job [ctab] SUCCEEDED." in out
        assert "master-replica-0\ttabulate 0." in out and " ctab" in out
        assert (tmp_path / "out" / "table.txt").read_text().strip() != ""
        assert ce.leftovers(engine, "ctab") == ([], [])
    finally:
        subprocess.run([engine.path, "rmi", "-f", name], capture_output=True)
