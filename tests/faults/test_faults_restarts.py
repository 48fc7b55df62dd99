"""Restart policies in the local runner, per replica type, with a tiny package of our own
(no TensorFlow) whose ps fails in a chosen way: ExitCode restarts statuses 128-255 and
never 1-127, no policy restarts a replica that exits 0, back-off doubles, config.yaml
sets the policy per replica type and the flags override it, a ps stopped by SIGTERM
(143) is restarted as preempted, the job record counts restarts and every run's exit
status per replica, and the supervisor's events are `service` lines in stream-logs."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.support.common import pid_alive
from submit import jobs as records
from submit.__main__ import main
from submit.errors import JobNotFoundError
from submit.local.supervisor import should_restart

FAKE_TASK = r'''
import json, os, sys, time
task = json.loads(os.environ["TF_CONFIG"])["task"]
job_dir = sys.argv[sys.argv.index("--job-dir") + 1]
if task["type"] == "ps":
    # Fail with each status of FAKE_PS_EXITS in turn (one per start), then serve.
    starts = os.path.join(job_dir, "ps-starts")
    n = len(open(starts).read()) if os.path.exists(starts) else 0
    with open(starts, "a") as f:
        f.write("x")
    exits = [int(s) for s in os.environ.get("FAKE_PS_EXITS", "").split(",") if s]
    if n < len(exits):
        time.sleep(0.3)
        sys.exit(exits[n])
if task["type"] == "chief":
    time.sleep(float(os.environ.get("FAKE_CHIEF_SLEEP", "6")))
    sys.exit(0)
time.sleep(600)
'''


@pytest.fixture
def pkg(tmp_path):
    folder = tmp_path / "pkg"
    (folder / "fakejob").mkdir(parents=True)
    (folder / "setup.py").write_text('from setuptools import setup\nsetup(name="fakejob", '
                                     'version="0.1", packages=["fakejob"])\n')
    (folder / "fakejob" / "__init__.py").write_text("")
    (folder / "fakejob" / "task.py").write_text(FAKE_TASK)
    return str(folder)


def run_job(capsys, tmp_path, pkg, job_id, ps_config="", *flags):
    config = tmp_path / f"{job_id}.yaml"
    config.write_text("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
                      "  workerCount: 1\n  parameterServerCount: 1\n" + ps_config)
    status = main([job_id, "--job-dir", str(tmp_path / job_id), "--package-path", pkg,
                   "--module-name", "fakejob.task", "--config", str(config), *flags],
                  standalone_mode=False)
    out, err = capsys.readouterr()
    record = records.load(job_id)
    assert [r.pid for r in record.replicas if r.pid and pid_alive(r.pid)] == []
    return status, out, err, record


def ps_restarts(record) -> int:
    return {r.label: r.restarts for r in record.replicas}["ps-replica-0"]


@pytest.mark.parametrize("status,policy,restart", [
    (1, "ExitCode", False), (2, "ExitCode", False), (127, "ExitCode", False),
    (128, "ExitCode", True), (137, "ExitCode", True), (143, "ExitCode", True),
    (200, "ExitCode", True), (255, "ExitCode", True), (0, "ExitCode", False),
    (1, "OnFailure", True), (0, "OnFailure", False), (137, "Always", True),
    (0, "Always", False), (200, "Never", False)])
def test_policy_decides_which_statuses_restart(status, policy, restart):
    """A replica that exits 0 finished: no policy restarts it (the MWMS workers that
    ExitCode used to bring back after they finished)."""
    assert should_restart(policy, status) is restart


@pytest.mark.slow  # long: CI runs it in the slow step
def test_per_type_policy_from_config_restarts_with_back_off(capsys, tmp_path, pkg,
                                                            monkeypatch):
    monkeypatch.setenv("FAKE_PS_EXITS", "137,200")   # killed, then peer lost: both retryable
    status, out, err, record = run_job(
        capsys, tmp_path, pkg, "pertype",
        "  parameterServerConfig:\n    restartPolicy: ExitCode\n    maxRestarts: 2\n")
    assert status == 0, err
    assert "ps-replica-0 exited with status 137; restarting in 1 s" in out
    assert "ps-replica-0 exited with status 200; restarting in 2 s" in out
    assert record.state == records.SUCCEEDED and ps_restarts(record) == 2
    assert {r.label: r.restarts for r in record.replicas}["master-replica-0"] == 0


def test_exit_code_policy_never_restarts_a_permanent_failure(capsys, tmp_path, pkg,
                                                             monkeypatch):
    monkeypatch.setenv("FAKE_PS_EXITS", "3")
    status, out, err, record = run_job(capsys, tmp_path, pkg, "permanent", "",
                                       "--restart-policy", "ExitCode", "--max-restarts", "3")
    assert status == 1 and "ps-replica-0 exited with a non-zero status of 3" in err
    assert "restarting" not in out
    assert record.state == records.FAILED and ps_restarts(record) == 0


def test_restarts_run_out(capsys, tmp_path, pkg, monkeypatch):
    monkeypatch.setenv("FAKE_PS_EXITS", "200,200")
    status, _, err, record = run_job(
        capsys, tmp_path, pkg, "runout",
        "  parameterServerConfig: {restartPolicy: ExitCode, maxRestarts: 1}\n")
    assert status == 1 and "non-zero status of 200" in err
    assert ps_restarts(record) == 1


def test_flags_override_the_config_policy(capsys, tmp_path, pkg, monkeypatch):
    monkeypatch.setenv("FAKE_PS_EXITS", "200")
    status, out, err, record = run_job(
        capsys, tmp_path, pkg, "override",
        "  parameterServerConfig: {restartPolicy: ExitCode, maxRestarts: 2}\n",
        "--restart-policy", "Never")
    assert status == 1 and "non-zero status of 200" in err
    assert ps_restarts(record) == 0


def test_a_replica_that_exits_0_is_never_restarted(capsys, tmp_path, pkg, monkeypatch):
    """Under ExitCode (the MWMS bug's policy; the table covers the others): the ps's
    exit 0 ends it for good, it is not judged as preempted, and the record keeps the
    status of its one run."""
    monkeypatch.setenv("FAKE_PS_EXITS", "0")
    monkeypatch.setenv("FAKE_CHIEF_SLEEP", "3")  # a restart would come after 1 s
    status, out, err, record = run_job(capsys, tmp_path, pkg, "finished", "",
                                       "--restart-policy", "ExitCode", "--max-restarts", "2")
    assert status == 0, err
    assert "restarting" not in out
    ps = {r.label: r for r in record.replicas}["ps-replica-0"]
    assert ps.restarts == 0 and ps.exit_codes == [0], ps
    assert len(open(os.path.join(tmp_path, "finished", "ps-starts")).read()) == 1


def test_a_server_stopped_while_the_chief_runs_is_restarted_as_preempted(
        capsys, tmp_path, pkg, monkeypatch):
    monkeypatch.setenv("FAKE_PS_EXITS", "143")   # what a ps does on SIGTERM
    status, out, err, record = run_job(capsys, tmp_path, pkg, "preempted", "",
                                       "--restart-policy", "ExitCode", "--max-restarts", "1")
    assert status == 0, err
    assert "ps-replica-0 exited with status 143; restarting in 1 s" in out
    assert ps_restarts(record) == 1
    assert len(open(os.path.join(tmp_path, "preempted", "ps-starts")).read()) == 2


@pytest.mark.slow  # long: CI runs it in the slow step
def test_a_restart_policy_alone_survives_a_sigkilled_worker(capsys, tmp_path, pkg,
                                                            monkeypatch):
    """--restart-policy OnFailure with no --max-restarts allows the default restarts: the
    worker this test SIGKILLs from outside comes back and the job succeeds."""
    monkeypatch.setenv("FAKE_CHIEF_SLEEP", "12")
    killed = []

    def kill_the_worker():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                record = records.load("sigkilled")
            except JobNotFoundError:  # not written yet
                record = None
            worker = record and {r.label: r for r in record.replicas}.get("worker-replica-0")
            if worker and worker.pid and worker.state == "RUNNING" and pid_alive(worker.pid):
                time.sleep(1.0)
                os.kill(worker.pid, signal.SIGKILL)
                killed.append(worker.pid)
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_the_worker, daemon=True)
    killer.start()
    status, out, err, record = run_job(capsys, tmp_path, pkg, "sigkilled", "",
                                       "--restart-policy", "OnFailure")
    killer.join(timeout=5)
    assert killed, "the worker never ran"
    assert status == 0, err
    assert "worker-replica-0 exited with status 137; restarting in 1 s" in out
    assert record.state == records.SUCCEEDED
    worker = {r.label: r for r in record.replicas}["worker-replica-0"]
    assert worker.restarts == 1 and worker.pid != killed[0]
    # Every run's status: the SIGKILL, then the stop at the job's end (SIGTERM, 143).
    assert worker.exit_codes == [137, 143], worker
    assert main(["jobs", "describe", "sigkilled"], standalone_mode=False) == 0
    described = capsys.readouterr().err  # the readable lines, beside the YAML on stdout
    assert "worker-replica-0: STOPPED, 1 restart; exit status of each run: 137, 143" \
        in described
    # The supervisor's events are service lines in stream-logs, in the order they came.
    assert main(["jobs", "stream-logs", "sigkilled", "--task-name", "service"],
                standalone_mode=False) == 0
    *followed, last = capsys.readouterr().out.splitlines()
    assert last == "Job [sigkilled] SUCCEEDED."  # as the job life reports every job's end
    service = [line.split("\t") for line in followed]
    assert {fields[2] for fields in service} == {"service"}
    events = [fields[3] for fields in service]
    expected = ["job PREPARING", "worker-replica-0 started (pid", "job RUNNING",
                "worker-replica-0 exited with status 137; restarting in 1 s (restart 1 "
                "of 6, policy OnFailure)", f"worker-replica-0 started (pid {worker.pid}, "
                "restart 1)", "master-replica-0 exited with status 0", "job SUCCEEDED"]
    at = [next(i for i, e in enumerate(events) if e.startswith(x)) for x in expected]
    assert at == sorted(at), events


@pytest.mark.slow  # two TensorFlow replicas under MultiWorkerMirroredStrategy, ~1 minute
def test_multiworker_workers_that_finish_are_not_restarted(capsys, tmp_path):
    """The bug as users met it: the real trainer under MultiWorkerMirrored (a master and
    a worker, no ps) with restartPolicy ExitCode; the worker ends with 0 when training
    is done and was restarted ("exited with status 0; restarting in 1 s")."""
    config = tmp_path / "mwms.yaml"
    config.write_text("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
                      "  workerType: standard\n  workerCount: 1\n"
                      "  workerConfig: {restartPolicy: ExitCode, maxRestarts: 3}\n")
    status = main(["mwms", "--config", str(config), "--job-dir", str(tmp_path / "mwms"),
                   "--", "--model", "mlp", "--train-steps", "40", "--batch-size", "32"],
                  standalone_mode=False)
    out, err = capsys.readouterr()
    assert status == 0, err[-3000:]
    assert "training started: strategy=multiworker" in out, out[-3000:]
    assert "restarting" not in out
    record = records.load("mwms")
    assert record.state == records.SUCCEEDED
    worker = {r.label: r for r in record.replicas}["worker-replica-0"]
    assert worker.restarts == 0 and len(worker.exit_codes) == 1, worker
    assert worker.exit_codes[0] in (0, 143), worker  # finished, or stopped with the job
