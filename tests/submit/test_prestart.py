"""A tuning job's next trial starts in processes started ahead (`submit.local.prestart`,
`mljob.prestart`): real tuning jobs whose trainer imports TensorFlow (through mljob's
training library or not), each trial's process telling what it saw; the pool's hand-over
with real processes (a stand-in `tensorflow` package keeps those cheap); every process
stopped by PID, the ready ones too, however the job ends."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
import yaml

from mljob import prestart as zygote
from submit import jobs as records
from submit.local.prestart import Pool
from submit.local.supervisor import replica_env, spawn
from tests.support.common import pid_alive
from tests.support.submit_cli import run as submit_in_process, write_package

# A user's trainer: imports TensorFlow (after mljob's training library when
# TRIAL_LIBRARY=1), then writes what its process saw and reports through cloudml-hypertune.
TASK = r'''
import json, os, sys, time
seen = {"tensorflow_before": "tensorflow" in sys.modules,
        "library_before": "mljob.training" in sys.modules, "name": __name__,
        "argv0": sys.argv[0], "args": sys.argv[1:], "cwd": os.getcwd(),
        "stdin": sys.stdin.read(), "pid": os.getpid()}
if os.environ.get("TRIAL_LIBRARY") == "1":
    from mljob import training
    from mljob.training import kernels
    seen["kernels"] = kernels.choose_once().line()
import tensorflow as tf
import hypertune
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
job_dir = sys.argv[sys.argv.index("--job-dir") + 1]
seen["env"] = {k: os.environ.get(k) for k in (
    "CLOUD_ML_TRIAL_ID", "CLOUD_ML_HP_METRIC_FILE", "CLOUD_ML_JOB_ID",
    "TF_ENABLE_ONEDNN_OPTS", "MLJOB_ONEDNN_CHOSEN", "GRPC_FAIL_FAST", "TRIAL_LIBRARY")}
seen["tf_config"] = json.loads(os.environ["TF_CONFIG"])
seen["sum"] = float(tf.reduce_sum(tf.constant([1.0, float(args["x"])])))
os.makedirs(job_dir, exist_ok=True)
with open(os.path.join(job_dir, "seen.json"), "w") as f:
    json.dump(seen, f)
time.sleep(float(os.environ.get("TRIAL_SLEEP", "1.5")))
hypertune.HyperTune().report_hyperparameter_tuning_metric(
    hyperparameter_metric_tag="score", metric_value=-abs(float(args["x"])), global_step=1)
sys.exit(int(os.environ.get("TRIAL_EXIT", "0")))
'''


def config(tmp_path, trials: int, **more) -> str:
    spec = {"goal": "MAXIMIZE", "hyperparameterMetricTag": "score", "maxTrials": trials,
            "maxParallelTrials": 1,
            "params": [{"parameterName": "x", "type": "DOUBLE", "minValue": -1.0,
                        "maxValue": 1.0}], **more}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"trainingInput": {"hyperparameters": spec}}))
    return str(path)


def tune(capsys, tmp_path, job_id: str, trials: int, **more):
    pkg = write_package(tmp_path / "pkg", TASK)
    return submit_in_process(capsys, job_id, "--config", config(tmp_path, trials, **more),
                             "--job-dir", str(tmp_path / job_id), "--package-path", pkg,
                             "--module-name", "fakejob.task")


def service_lines(tmp_path, job_id: str) -> str:
    """The job's supervisor events and its trials' (`logs/<trial>/service.log`)."""
    logs = tmp_path / job_id / "logs"
    return "".join(p.read_text() for p in sorted(logs.glob("**/service.log")))


def started(service: str) -> dict[str, tuple[int, bool]]:
    """Each trial's master: its PID and whether its process was pre-started."""
    out = {}
    for trial, pid, ready in re.findall(
            r"(\d+)/master-replica-0 started \(pid (\d+)(, pre-started)?\)", service):
        out[trial] = (int(pid), bool(ready))
    return out


def waiting_children() -> list[psutil.Process]:
    """Pre-started processes of this (the launching) process still alive."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if zygote.__name__ in " ".join(child.cmdline()) and child.status() != "zombie":
                found.append(child)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def library_env(monkeypatch):
    """Each replica makes its own kernel choice (none inherited from this process); the
    default MLJOB_PRESTART (auto) on two cores, whatever the machine's count."""
    for name in ("TF_ENABLE_ONEDNN_OPTS", "MLJOB_ONEDNN_CHOSEN", "MLJOB_PRESTART"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})


@pytest.mark.parametrize("library", [True, False], ids=["library", "tensorflow-alone"])
def test_trials_after_the_first_run_in_processes_started_ahead(
        capsys, tmp_path, monkeypatch, library_env, library):
    monkeypatch.setenv("TRIAL_LIBRARY", "1" if library else "0")
    status, out, err = tune(capsys, tmp_path, "pre01", 3)
    assert status == 0, err
    record = records.load("pre01")
    assert record.state == records.SUCCEEDED
    service = service_lines(tmp_path, "pre01")
    masters = started(service)
    assert {t: ready for t, (_, ready) in masters.items()} == \
        {"1": False, "2": True, "3": True}, service
    trials = {t["trialId"]: t for t in record.training_output["trials"]}
    seen = {t: json.loads((tmp_path / "pre01" / t / "seen.json").read_text())
            for t in trials}
    for trial_id, s in seen.items():
        x = trials[trial_id]["hyperparameters"]["x"]
        # the trial's own order: arguments, cluster, metric file, as a fresh process
        assert s["name"] == "__main__" and s["argv0"].endswith(
            os.path.join("fakejob", "task.py"))
        assert s["args"] == [f"--x={x}", "--job-dir", str(tmp_path / "pre01" / trial_id)]
        # TensorFlow adds in float32: 1 + x for x near -1 keeps few digits
        assert s["sum"] == float(np.float32(1.0) + np.float32(x))
        assert s["tf_config"]["task"]["trial"] == trial_id
        assert s["env"]["CLOUD_ML_TRIAL_ID"] == trial_id
        assert s["env"]["CLOUD_ML_JOB_ID"] == "pre01"
        assert s["stdin"] == ""
        assert s["pid"] == masters[trial_id][0]
        # imported ahead only by the pre-started ones; the library only where used
        assert s["tensorflow_before"] is (trial_id != "1")
        assert s["library_before"] is (library and trial_id != "1")
    assert len({s["env"]["CLOUD_ML_HP_METRIC_FILE"] for s in seen.values()}) == 3
    assert len({s["cwd"] for s in seen.values()}) == 1
    # every trial computes with the same kernels and sees the same variables
    assert len({json.dumps(s["env"]["TF_ENABLE_ONEDNN_OPTS"]) for s in seen.values()}) == 1
    assert len({json.dumps(s.get("kernels")) for s in seen.values()}) == 1
    if library:
        assert seen["1"]["kernels"].startswith("cpu kernels: ")
    assert [t["state"] for t in trials.values()] == ["SUCCEEDED"] * 3
    assert [r.pid for r in record.replicas if r.pid and pid_alive(r.pid)] == []
    assert waiting_children() == []


def test_auto_starts_none_ahead_when_the_trials_take_every_core(capsys, tmp_path,
                                                                 monkeypatch, library_env):
    monkeypatch.setenv("TRIAL_SLEEP", "0")
    status, _, err = tune(capsys, tmp_path, "pre05", 3, maxParallelTrials=2)
    assert status == 0, err
    service = service_lines(tmp_path, "pre05")
    assert "trials start afresh: 2 trial process(es) at once on 2 core(s) leave none " \
        "for processes started ahead (MLJOB_PRESTART=1 starts them anyway)" in service
    assert "pre-started" not in service and len(started(service)) == 3
    assert not (tmp_path / "pre05" / "1" / "seen.json").read_text().count(
        '"tensorflow_before": true')


@pytest.mark.slow
def test_no_process_is_started_ahead_when_turned_off(capsys, tmp_path, monkeypatch,
                                                     library_env):
    monkeypatch.setenv("MLJOB_PRESTART", "0")
    monkeypatch.setenv("TRIAL_LIBRARY", "1")
    monkeypatch.setenv("TRIAL_SLEEP", "0.5")
    status, _, err = tune(capsys, tmp_path, "pre02", 2)
    assert status == 0, err
    masters = started(service_lines(tmp_path, "pre02"))
    assert {t: ready for t, (_, ready) in masters.items()} == {"1": False, "2": False}
    seen = json.loads((tmp_path / "pre02" / "2" / "seen.json").read_text())
    assert seen["tensorflow_before"] is False


def test_a_job_that_ends_early_stops_the_process_waiting_for_the_next_trial(
        capsys, tmp_path, monkeypatch, library_env):
    monkeypatch.setenv("TRIAL_LIBRARY", "1")
    monkeypatch.setenv("TRIAL_EXIT", "1")
    monkeypatch.setenv("TRIAL_SLEEP", "4")  # the next trial's process starts meanwhile
    status, _, err = tune(capsys, tmp_path, "pre03", 3, maxFailedTrials=1)
    assert status != 0
    record = records.load("pre03")
    assert record.state == records.FAILED and "maxFailedTrials" in record.error_message
    assert waiting_children() == []  # stopped when the job ended, not at our exit


def test_ctrl_c_stops_the_trial_and_the_process_started_ahead(tmp_path, reaper,
                                                              library_env):
    pkg = write_package(tmp_path / "pkg", TASK)
    env = {**os.environ, "TRIAL_LIBRARY": "1", "TRIAL_SLEEP": "120",
           "PYTHONUNBUFFERED": "1", "MLJOB_PRESTART": "1"}
    launcher = reaper.python(
        "-m", "submit", "pre04", "--config", config(tmp_path, 3), "--job-dir",
        str(tmp_path / "pre04"), "--package-path", pkg, "--module-name", "fakejob.task",
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    ready: list[psutil.Process] = []
    while not ready and time.monotonic() < deadline and launcher.poll() is None:
        time.sleep(0.5)
        ready = [p for p in psutil.Process(launcher.pid).children(recursive=True)
                 if zygote.__name__ in " ".join(p.cmdline())]
    assert ready, "no process was started ahead of the second trial"
    trial = started(service_lines(tmp_path, "pre04"))["1"][0]
    os.kill(launcher.pid, signal.SIGINT)
    assert launcher.wait(60) != 0
    assert records.load("pre04").state == records.CANCELLED
    assert not pid_alive(trial) and not pid_alive(ready[0].pid)


# --- the pool with real processes, TensorFlow stood in for ---------------------------

STAND_IN = "import os\nos.environ['STAND_IN_TF'] = 'imported'\n"
USER_MODULE = r'''
import json, os, sys
print(json.dumps({"name": __name__, "argv": sys.argv, "cwd": os.getcwd(),
                  "tf": "tensorflow" in sys.modules, "stdin": sys.stdin.read(),
                  "env": {k: os.environ.get(k) for k in (
                      "TF_CONFIG", "STAND_IN_TF", "JOB_ONLY", "MLJOB_PARENT_PID")}}),
      flush=True)
sys.exit(7)
'''


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """A folder on PYTHONPATH with a stand-in `tensorflow` (it sets a variable when
    imported) and a user's module `usermod`; the environment a replica would get."""
    root = tmp_path / "path"
    (root / "tensorflow").mkdir(parents=True)
    (root / "tensorflow" / "__init__.py").write_text(STAND_IN)
    (root / "usermod.py").write_text(USER_MODULE)
    monkeypatch.setenv("PYTHONPATH", f"{root}{os.pathsep}{os.environ['PYTHONPATH']}")
    monkeypatch.delenv("STAND_IN_TF", raising=False)
    env, _ = replica_env({"TF_CONFIG": json.dumps({"task": {"type": "master", "index": 0}}),
                          "JOB_ONLY": "a"}, os.getpid())
    return env


def ready_pool(env, cwd, notes, command=None):
    pool = Pool(spawn, note=notes.append)
    pool.fill([(command or [sys.executable, "-m", "usermod"], env, False)], str(cwd))
    [pid] = pool.pids
    return pool, pid


def test_a_ready_process_becomes_the_replica_it_is_handed(tmp_path, stand_in):
    notes: list[str] = []
    pool, pid = ready_pool(stand_in, tmp_path, notes)
    order_env = {**stand_in, "TF_CONFIG": json.dumps({"task": {"type": "master",
                                                                "index": 0, "trial": "2"}})}
    try:
        proc = pool.take([sys.executable, "-m", "usermod", "--a=1", "b c"], str(tmp_path),
                         order_env)
        assert proc is not None and proc.pid == pid
        out, err = proc.communicate(timeout=60)
    finally:
        pool.close()
    assert proc.returncode == 7, err
    seen = json.loads(out.decode().strip().splitlines()[-1])
    assert seen["name"] == "__main__" and seen["argv"][1:] == ["--a=1", "b c"]
    assert seen["argv"][0].endswith("usermod.py") and seen["stdin"] == ""
    assert seen["cwd"] == str(tmp_path) and seen["tf"] is True
    assert json.loads(seen["env"]["TF_CONFIG"])["task"]["trial"] == "2"  # the order's
    assert seen["env"]["STAND_IN_TF"] == "imported"  # what its import set, kept
    assert seen["env"]["JOB_ONLY"] == "a" and seen["env"]["MLJOB_PARENT_PID"] == \
        str(os.getpid())
    assert notes == [] and pool.pids == []


def test_a_replica_started_otherwise_starts_afresh_and_stops_the_ready_one(
        tmp_path, stand_in):
    notes: list[str] = []
    pool, pid = ready_pool(stand_in, tmp_path, notes)
    changed = {**stand_in, "JOB_ONLY": "b"}
    try:
        assert pool.take([sys.executable, "-m", "usermod"], str(tmp_path), changed) is None
        assert not pid_alive(pid)
        assert notes and "its environment differs in JOB_ONLY" in notes[0]
        pool.fill([([sys.executable, "-m", "usermod"], stand_in, False)], str(tmp_path))
        assert pool.pids == []  # every next one would differ too: none started
        other = Pool(spawn, note=notes.append)
        other.fill([([sys.executable, "-m", "usermod"], stand_in, False)], str(tmp_path))
        [again] = other.pids
        assert other.take([sys.executable, "-m", "othermod"], str(tmp_path),
                          stand_in) is None  # no ready process of that module
        assert other.take([sys.executable, "script.py"], str(tmp_path), stand_in) is None
        other.close()
        assert not pid_alive(again)
    finally:
        pool.close()


def test_a_ready_process_that_cannot_import_ends_pre_starting(tmp_path, stand_in):
    (tmp_path / "path" / "tensorflow" / "__init__.py").write_text("raise ImportError('no')\n")
    notes: list[str] = []
    pool, pid = ready_pool(stand_in, tmp_path, notes)
    try:
        deadline = time.monotonic() + 60
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        pool.fill([([sys.executable, "-m", "usermod"], stand_in, False)], str(tmp_path))
        assert pool.pids == [] and "exited before its order (status 3)" in notes[0]
        assert pool.take([sys.executable, "-m", "usermod"], str(tmp_path), stand_in) is None
    finally:
        pool.close()


def test_a_ready_process_dies_with_its_launcher(tmp_path, stand_in, reaper):
    script = tmp_path / "launcher.py"
    script.write_text(
        "import os, sys, time\n"
        "from submit.local.prestart import Pool\n"
        "from submit.local.supervisor import replica_env, spawn\n"
        "env, _ = replica_env({}, os.getpid())\n"
        "pool = Pool(spawn)\n"
        "pool.fill([([sys.executable, '-m', 'usermod'], env, False)], os.getcwd())\n"
        "print(pool.pids[0], flush=True)\n"
        "time.sleep(600)\n")
    launcher = reaper.python(str(script), cwd=str(tmp_path), stdout=subprocess.PIPE)
    assert launcher.stdout is not None
    pid = int(launcher.stdout.readline())
    assert pid_alive(pid)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait(10)
    deadline = time.monotonic() + 20
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(pid)


def test_the_switch_and_the_usage_line():
    assert zygote.setting({}) == zygote.AUTO == zygote.setting({"MLJOB_PRESTART": "maybe"})
    for on in ("1", "true", " YES ", "on"):
        assert zygote.setting({"MLJOB_PRESTART": on}) is True
    for off in ("0", "false", "No", " off "):
        assert zygote.setting({"MLJOB_PRESTART": off}) is False
    # auto: one trial of one process on 2 cores, yes; 4 processes, or 2 trials, no
    assert zygote.core_left_over(1, 2) and zygote.core_left_over(4, 8)
    assert not zygote.core_left_over(4, 2) and not zygote.core_left_over(2, 2)
    bad = subprocess.run([sys.executable, "-m", "mljob.prestart"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("usage: python -m mljob.prestart")
    assert "Traceback" not in bad.stderr
