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
import re
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


USER_TASK = """\
import argparse
from mljob import training            # before tensorflow, as README's example
import keras, numpy as np, tensorflow as tf
import mljob_probe_dep                # the package's pip dependency

p = argparse.ArgumentParser()
p.add_argument("--job-dir")
p.add_argument("--train-steps", type=int, default=100)
args = p.parse_args()
print("dependency", mljob_probe_dep.VALUE, flush=True)

def build_model():
    x = keras.Input(shape=(4,), name="x")
    h = keras.layers.Dense(16, activation="relu")(x)
    return keras.Model(x, keras.layers.Dense(3)(h))

def train_data(context):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 1).astype("int64")
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = ds.shard(context.num_input_pipelines, context.input_pipeline_id)
    return ds.shuffle(512, seed=context.seed).repeat().batch(context.batch_size)

training.main(
    build_model, train_data,
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    optimizer=lambda: keras.optimizers.Adam(1e-3), metrics=["accuracy"],
    config=training.RunConfig(job_dir=args.job_dir, train_steps=args.train_steps))
"""


def test_build_image_runs_a_user_package_that_imports_mljob(capsys, monkeypatch, engine,
                                                              tmp_path):
    """`--build-image` with no base image named (built here when missing): a user's
    package whose task does `from mljob import training` (README's example) and whose
    setup.py requires a distribution no index has (a wheel in a folder this machine's pip
    is pointed at, PIP_FIND_LINKS) is built into an image holding mljob's core, and runs
    as chief, workers and ps to SUCCEEDED; the job's record names its module."""
    from tests.e2e.test_pyproject_package import build_dependency
    monkeypatch.setenv("PIP_FIND_LINKS", build_dependency(tmp_path))
    pkg = tmp_path / "pkg"
    (pkg / "mytrainer").mkdir(parents=True)
    (pkg / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='mytrainer', version='0.1', "
        "packages=['mytrainer'], install_requires=['mljob-probe-dep==1.0'])\n")
    (pkg / "mytrainer" / "__init__.py").write_text("")
    (pkg / "mytrainer" / "task.py").write_text(USER_TASK)
    conf = tmp_path / "config.yaml"
    conf.write_text(yaml.safe_dump({"trainingInput": {
        "scaleTier": "CUSTOM", "masterType": ONE_CPU, "workerType": ONE_CPU,
        "parameterServerType": ONE_CPU, "workerCount": 2, "parameterServerCount": 1}}))
    name = f"localhost/mytrainer:{os.getpid()}"
    job_dir = tmp_path / "out"
    try:
        status, out, err = run(capsys, "cuser", "--package-path", str(pkg),
                               "--module-name", "mytrainer.task", "--build-image", name,
                               "--config", str(conf), "--job-dir", str(job_dir), "--",
                               "--train-steps", "60")
        assert status == 0, (err + out)[-3000:]
        assert "Job [cuser] SUCCEEDED." in out
        assert "master-replica-0\tdependency probe 42" in out
        record = records.load("cuser")
        assert record.state == records.SUCCEEDED
        assert sorted(r.label for r in record.replicas) == [
            "master-replica-0", "ps-replica-0", "worker-replica-0", "worker-replica-1"]
        assert (job_dir / "checkpoints" / "ckpt-60.index").exists()
        status, out, err = run(capsys, "jobs", "describe", "cuser")
        assert status == 0 and "pythonModule: mytrainer.task" in out, out
        status, out, err = run(capsys, "jobs", "describe", "cuser", "--summarize")
        assert status == 0 and "mytrainer.task" in out, out
        assert not re.search(r"(?<![A-Za-z_.])trainer\.task", out), out
        assert ce.leftovers(engine, "cuser") == ([], [])
    finally:
        subprocess.run([engine.path, "rmi", "-f", name], capture_output=True)


def test_local_run_runs_a_folder_as_vertexs_local_run(capsys, monkeypatch, engine,
                                                      tmp_path):
    """`local-run` as `gcloud ai custom-jobs local-run`: a folder without setup.py (the
    module's package in it), `--requirements` a distribution no index has (from a local
    folder, PIP_FIND_LINKS) and the folder's requirements.txt, on the base image as
    `--executor-image-uri`, named `--output-image-uri`, the module's arguments after
    `--`: one container runs it to SUCCEEDED."""
    from tests.e2e.test_pyproject_package import build_dependency
    monkeypatch.setenv("PIP_FIND_LINKS", build_dependency(tmp_path))
    work = tmp_path / "work"
    (work / "my_training").mkdir(parents=True)
    (work / "my_training" / "task.py").write_text(
        "import sys, mljob, mljob_probe_dep\n"
        "print('ran with', sys.argv[1:], mljob_probe_dep.VALUE, flush=True)\n")
    (work / "requirements.txt").write_text("# the folder's own, as local-run reads it\n")
    name = f"localhost/localrun:{os.getpid()}"
    try:
        status, out, err = run(capsys, "local-run", "--executor-image-uri",
                               image_build.base_image(engine), "--local-package-path",
                               str(work), "--python-module", "my_training.task",
                               "--requirements", "mljob-probe-dep==1.0",
                               "--output-image-uri", name, "--", "--epochs", "2")
        assert status == 0, (err + out)[-3000:]
        assert "ran with ['--epochs', '2'] probe 42" in out
        assert "SUCCEEDED" in out
        assert ce.image_exists(engine, name)
    finally:
        subprocess.run([engine.path, "rmi", "-f", name], capture_output=True)
