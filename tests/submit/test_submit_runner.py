"""The local runner's mechanics with a tiny package of our own (no TensorFlow): one real
process per replica, TF_CONFIG per replica, labelled logs, restarts, failure, cancel by
`jobs cancel` and by SIGINT, a killed launcher, memory:// mirroring and `local train`.
Every replica PID the runner records is checked dead afterwards."""
from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.support.common import ROOT, free_ports, pid_alive
from submit import jobs as records
from submit import logs
from submit.packaging import package
from tests.support.submit_cli import run as submit_in_process, write_package

FAKE_TASK = r'''
import json, os, sys, time
cfg = json.loads(os.environ.get("TF_CONFIG") or "{}")
task = cfg.get("task", {})
job_dir = sys.argv[sys.argv.index("--job-dir") + 1] if "--job-dir" in sys.argv else None
print("argv", json.dumps(sys.argv[1:]))
print("tf_config", json.dumps(cfg, sort_keys=True))
print("module", __file__)
print("parent", os.environ.get("MLJOB_PARENT_PID"), os.getppid())
print("engine_vars", json.dumps(sorted(k for k in os.environ
                                       if k == "CLUSTER_SPEC" or k.startswith("AIP_"))))
if task.get("type") in ("chief", "master"):
    if job_dir:
        print("resumed", os.path.exists(os.path.join(job_dir, "checkpoints", "checkpoint")))
        os.makedirs(os.path.join(job_dir, "checkpoints"), exist_ok=True)
        with open(os.path.join(job_dir, "checkpoints", "checkpoint"), "w") as f:
            f.write("ckpt-3\n")
    for i in range(1, 4):
        print(f"step {i}/3 loss=0.{i} accuracy=0.5 examples/s=1.0 lr=0.1", flush=True)
    time.sleep(float(os.environ.get("FAKE_CHIEF_SLEEP", "0.5")))
    sys.exit(int(os.environ.get("FAKE_CHIEF_EXIT", "0")))
if task.get("type") == "worker" and os.environ.get("FAKE_WORKER_FAIL_ONCE"):
    marker = os.path.join(job_dir, f"failed-{task['index']}")
    if not os.path.exists(marker):
        open(marker, "w").close()
        print("error: worker lost its peer", file=sys.stderr, flush=True)
        sys.exit(200)
if task.get("type") == "evaluator":  # like the trainer's: ends after the last checkpoint
    while not os.path.exists(os.path.join(job_dir, "checkpoints", "checkpoint")):
        time.sleep(0.1)
    time.sleep(1)
    print("evaluator finished", flush=True)
    sys.exit(0)
time.sleep(600)
'''


@pytest.fixture
def pkg(tmp_path):
    return write_package(tmp_path / "pkg", FAKE_TASK)


def log_lines(log_file: str) -> list[list[str]]:
    with open(log_file) as f:
        return [line.rstrip("\n").split("\t", 3) for line in f]


def printed(log_file: str, key: str) -> str:
    for _, _, _, text in log_lines(log_file):
        if text.startswith(key + " "):
            return text[len(key) + 1:]
    raise AssertionError(f"{key} not in {log_file}")


def assert_all_dead(record: records.JobRecord) -> None:
    pids = [r.pid for r in record.replicas if r.pid]
    assert pids, "no replica was started"
    assert [p for p in pids if pid_alive(p)] == []


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def load_or_none(job_id):
    try:
        return records.load(job_id)
    except Exception:  # noqa: BLE001 - not written yet
        return None


def test_custom_job_runs_each_replica_from_the_staged_package(capsys, tmp_path, pkg,
                                                             monkeypatch):
    # submitted from inside a Vertex AI job or notebook: its variables stay out
    for name in ("CLUSTER_SPEC", "AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR",
                 "AIP_TENSORBOARD_LOG_DIR"):
        monkeypatch.setenv(name, "gs://elsewhere/x" if name != "CLUSTER_SPEC" else "{}")
    job_dir = str(tmp_path / "job")
    config = tmp_path / "config.yaml"
    config.write_text("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
                      "  workerCount: 2\n  parameterServerCount: 1\n  evaluatorCount: 1\n")
    status, out, err = submit_in_process(
        capsys, "job01", "--config", str(config), "--job-dir", job_dir, "--package-path",
        pkg, "--module-name", "fakejob.task", "--", "--train-steps", "3")
    assert status == 0, err
    record = records.load("job01")
    assert record.state == records.SUCCEEDED
    assert record.start_time <= record.end_time
    labels = sorted(r.label for r in record.replicas)
    assert labels == ["evaluator-replica-0", "master-replica-0", "ps-replica-0",
                      "worker-replica-0", "worker-replica-1"]
    assert_all_dead(record)
    by_label = {r.label: r for r in record.replicas}
    assert by_label["master-replica-0"].exit_code == 0
    assert by_label["ps-replica-0"].state == "STOPPED"
    assert (by_label["evaluator-replica-0"].state,
            by_label["evaluator-replica-0"].exit_code) == ("EXITED", 0)
    # the record is also in the job dir, and logs are per replica, labelled, timestamped
    with open(os.path.join(job_dir, "jobs", "job01.json")) as f:
        assert json.load(f)["state"] == "SUCCEEDED"
    env_root = os.path.realpath(environment(out))
    seen_ports = set()
    for label in labels:
        log_file = os.path.join(job_dir, "logs", f"{label}.log")
        severity, stamp, line_label, _ = log_lines(log_file)[0]
        assert (severity, line_label) == ("INFO", label)
        assert stamp.endswith(" +0000") and len(stamp) == 25
        # installed in the package's environment, not imported from the working tree
        assert os.path.realpath(printed(log_file, "module")).startswith(env_root)
        assert json.loads(printed(log_file, "argv")) == ["--train-steps", "3", "--job-dir",
                                                         job_dir]
        tf_config = json.loads(printed(log_file, "tf_config"))
        kind, _, index = label.split("-")
        assert tf_config["task"] == {"type": {"master": "chief"}.get(kind, kind),
                                     "index": int(index)}
        assert tf_config["environment"] == "cloud"
        assert tf_config["job"]["evaluatorCount"] == 1
        assert sorted(tf_config["cluster"]) == ["chief", "ps", "worker"]
        seen_ports.add(json.dumps(tf_config["cluster"], sort_keys=True))
        assert printed(log_file, "engine_vars") == "[]"
        parent, ppid = printed(log_file, "parent").split()
        assert parent == ppid == str(os.getpid())  # MLJOB_PARENT_PID is the runner
    assert len(seen_ports) == 1  # every replica sees the same cluster
    assert "master-replica-0\tstep 3/3 loss=0.3" in out


def environment(out: str) -> str:
    """The package environment a job's output says its replicas ran in (the package
    and mljob's core, which every replica's launcher is)."""
    key = re.search(r"package environment ([0-9a-f]{12}) (created|reused)", out).group(1)
    found = [d for d in os.listdir(package.env_root())
             if d.startswith(key) and "." not in d]
    assert len(found) == 1, found
    return os.path.join(package.env_root(), found[0])


def test_second_submit_reuses_the_package_environment(capsys, tmp_path, pkg, monkeypatch):
    monkeypatch.setenv("MLJOB_ENV_CACHE", str(tmp_path / "envs"))
    args = ["--package-path", pkg, "--module-name", "fakejob.task"]
    status, out, err = submit_in_process(capsys, "first", "--job-dir",
                                         str(tmp_path / "a"), *args)
    assert status == 0, err
    env = environment(out)
    key = os.path.basename(env)
    assert f"package environment {key[:12]} created" in out
    before = os.stat(env).st_mtime_ns
    status, out, err = submit_in_process(capsys, "second", "--job-dir",
                                         str(tmp_path / "b"), *args)
    assert status == 0, err
    assert environment(out) == env
    assert f"package environment {key[:12]} reused" in out
    assert os.stat(env).st_mtime_ns == before
    # the link and the folder it names: no half-built leftovers
    assert sorted(os.listdir(tmp_path / "envs")) == sorted([key, os.readlink(env)])
    # the supervisor's events, those raised before the log folder existed included
    status, streamed, err = submit_in_process(capsys, "jobs", "stream-logs", "second",
                                              "--task-name", "service")
    assert status == 0, err
    events = [line.split("\t")[3] for line in streamed.splitlines() if "\tservice\t" in line]
    expected = ["job PREPARING", f"package environment {key[:12]}: installing "
                "fakejob-0.1.tar.gz", f"package environment {key[:12]} reused in ",
                "master-replica-0 started (pid ", "job RUNNING"]
    assert len(events) > 5 and all(map(str.startswith, events, expected)), events
    assert events[-1] == "job SUCCEEDED"


def test_chief_failure_fails_the_job_and_stops_everyone(capsys, tmp_path, pkg, monkeypatch):
    monkeypatch.setenv("FAKE_CHIEF_EXIT", "3")
    status, out, err = submit_in_process(
        capsys, "job01", "--job-dir", str(tmp_path / "job"), "--package-path", pkg,
        "--module-name", "fakejob.task", "--scale-tier", "CUSTOM", "--config",
        _custom(tmp_path, workers=1, ps=1))
    assert status == 1
    assert err.strip().splitlines()[-1].startswith(
        "error: job job01 failed: The replica master-replica-0 exited with a non-zero "
        "status of 3.")
    record = records.load("job01")
    assert record.state == records.FAILED
    assert_all_dead(record)


def _custom(tmp_path, workers=0, ps=0) -> str:
    path = tmp_path / "custom.yaml"
    path.write_text(f"trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
                    f"  workerCount: {workers}\n  parameterServerCount: {ps}\n")
    return str(path)


def test_restart_policy_restarts_a_retryable_worker(capsys, tmp_path, pkg, monkeypatch):
    monkeypatch.setenv("FAKE_WORKER_FAIL_ONCE", "1")
    monkeypatch.setenv("FAKE_CHIEF_SLEEP", "3")
    common = ["--package-path", pkg, "--module-name", "fakejob.task", "--config",
              _custom(tmp_path, workers=1, ps=1)]
    status, _, err = submit_in_process(capsys, "never", "--job-dir", str(tmp_path / "a"),
                                       *common)
    assert status == 1 and "worker-replica-0 exited with a non-zero status of 200" in err
    assert_all_dead(records.load("never"))
    status, out, err = submit_in_process(
        capsys, "retry", "--job-dir", str(tmp_path / "b"), "--restart-policy", "ExitCode",
        "--max-restarts", "2", *common)
    assert status == 0, err
    assert "worker-replica-0 exited with status 200; restarting" in out
    record = records.load("retry")
    assert record.state == records.SUCCEEDED
    assert {r.label: r.restarts for r in record.replicas}["worker-replica-0"] == 1
    assert_all_dead(record)


def test_memory_job_dir_is_mirrored_before_success(capsys, pkg, memfs):
    status, _, err = submit_in_process(
        capsys, "job01", "--job-dir", "memory://bucket/job01", "--package-path", pkg,
        "--module-name", "fakejob.task", "--config", _custom_mem(pkg))
    assert status == 0, err
    files = set(memfs.find("/bucket/job01"))
    assert "/bucket/job01/checkpoints/checkpoint" in files  # written by the chief
    assert "/bucket/job01/logs/master-replica-0.log" in files
    assert "/bucket/job01/logs/worker-replica-0.log" in files
    assert "/bucket/job01/jobs/job01.json" in files
    assert any(f.startswith("/bucket/job01/packages/") for f in files)
    record = json.loads(memfs.cat_file("/bucket/job01/jobs/job01.json"))
    assert record["state"] == "SUCCEEDED"
    # preparing empties the mirrored log folder: the events raised before it survive it
    service = memfs.cat_file("/bucket/job01/logs/service.log").decode().splitlines()
    events = [line.split("\t")[3] for line in service]
    assert events[0] == "job PREPARING", events
    assert events[1].startswith("package environment "), events
    assert_all_dead(records.load("job01"))


def test_memory_job_dir_resume_sees_only_its_own_job_dir(capsys, pkg, memfs):
    common = ["--package-path", pkg, "--module-name", "fakejob.task"]

    def resumed(job_dir):
        log = memfs.cat_file(f"{job_dir}/logs/master-replica-0.log").decode()
        texts = [line.split("\t")[-1] for line in log.splitlines()]
        return [t for t in texts if t.startswith("resumed ")]

    for job_id, argv in (("job01", ["--job-dir", "memory://a/job01"]),
                         ("job02", ["--job-dir", "memory://b/job02"]),
                         ("job01", ["--job-dir", "memory://a/job01", "--resume"])):
        status, _, err = submit_in_process(capsys, job_id, *argv, *common)
        assert status == 0, err
    assert resumed("/b/job02") == ["resumed False"]
    # --resume starts from what the memory:// job dir holds; its log is appended to
    assert resumed("/a/job01") == ["resumed False", "resumed True"]


def _custom_mem(pkg) -> str:
    path = os.path.join(os.path.dirname(pkg), "mem.yaml")
    with open(path, "w") as f:
        f.write("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
                "  workerCount: 1\n")
    return path


def test_local_train_runs_the_working_tree_on_start_ports(capsys, tmp_path, pkg):
    start = free_ports(1)[0]
    start = start if start + 5 < 65535 else 20000
    status, _, err = submit_in_process(
        capsys, "local", "train", "--package-path", pkg, "--module-name", "fakejob.task",
        "--distributed", "--worker-count", "2", "--parameter-server-count", "1",
        "--start-port", str(start), "--job-dir", str(tmp_path / "job"), "--", "--x", "1")
    assert status == 0, err
    log_file = str(tmp_path / "job" / "logs" / "master-replica-0.log")
    assert printed(log_file, "module") == os.path.join(pkg, "fakejob", "task.py")
    cluster = json.loads(printed(log_file, "tf_config"))["cluster"]
    assert cluster == {"chief": [f"127.0.0.1:{start}"],
                       "worker": [f"127.0.0.1:{start + 1}", f"127.0.0.1:{start + 2}"],
                       "ps": [f"127.0.0.1:{start + 3}"]}
    assert json.loads(printed(log_file, "argv")) == ["--x", "1", "--job-dir",
                                                     str(tmp_path / "job")]
    status, _, err = submit_in_process(capsys, "local", "train", "--package-path", pkg,
                                       "--worker-count", "2")
    assert status == 2 and "need --distributed" in err


def _cli(*argv) -> list[str]:
    return [sys.executable, "-m", "submit", *argv]


def test_async_job_stream_logs_and_cancel(tmp_path, pkg, reaper):
    common = ["--package-path", pkg, "--module-name", "fakejob.task", "--config",
              _custom(tmp_path, workers=2, ps=1), "--async"]
    # a short job followed to its end by stream-logs from "another terminal"
    out = subprocess.run(_cli("short", "--job-dir", str(tmp_path / "short"), *common),
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    supervisor = records.load("short").supervisor_pid
    try:
        follow = subprocess.run(_cli("jobs", "stream-logs", "short", "--task-name",
                                     "master-replica-0"), cwd=ROOT, capture_output=True,
                                text=True, timeout=120)
        assert follow.returncode == 0, follow.stderr
        assert "\tmaster-replica-0\tstep 3/3 loss=0.3" in follow.stdout
        assert "worker-replica" not in follow.stdout
        assert records.load("short").state == records.SUCCEEDED
    finally:
        _kill_group(supervisor)

    # a long job cancelled from another terminal
    env = {**os.environ, "FAKE_CHIEF_SLEEP": "300"}
    out = subprocess.run(_cli("long", "--job-dir", str(tmp_path / "long"), *common),
                         cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    record = records.load("long")
    try:
        record = wait_for(lambda: (r := load_or_none("long")) and r.state == "RUNNING"
                          and r, 60, "the job to run")
        assert all(pid_alive(r.pid) for r in record.replicas)
        listing = subprocess.run(_cli("jobs", "list"), cwd=ROOT, capture_output=True,
                                 text=True, timeout=60)
        assert any(line.split()[:2] == ["long", "RUNNING"]
                   for line in listing.stdout.splitlines())
        cancel = subprocess.run(_cli("jobs", "cancel", "long"), cwd=ROOT,
                                capture_output=True, text=True, timeout=90)
        assert cancel.returncode == 0, cancel.stderr
        assert "Job [long] CANCELLED." in cancel.stdout
        record = records.load("long")
        assert record.state == records.CANCELLED
        assert_all_dead(record)
        wait_for(lambda: not pid_alive(record.supervisor_pid), 10, "the supervisor to exit")
        again = subprocess.run(_cli("jobs", "cancel", "long"), cwd=ROOT,
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 2 and "already ended CANCELLED" in again.stderr
    finally:
        _kill_group(record.supervisor_pid)


def _kill_group(pid):
    if pid:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def test_sigint_cancels_a_streaming_submit(tmp_path, pkg, reaper, monkeypatch):
    monkeypatch.setenv("FAKE_CHIEF_SLEEP", "300")
    proc = reaper.python("-m", "submit", "job01", "--job-dir", str(tmp_path / "job"),
                         "--package-path", pkg, "--module-name", "fakejob.task",
                         "--config", _custom(tmp_path, workers=1, ps=1), cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (r := load_or_none("job01")) and r.state == "RUNNING", 60,
             "the job to run")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Job [job01] CANCELLED." in out
    record = records.load("job01")
    assert record.state == records.CANCELLED
    assert_all_dead(record)


def test_replicas_die_with_a_killed_launcher(tmp_path, pkg, reaper, monkeypatch):
    monkeypatch.setenv("FAKE_CHIEF_SLEEP", "300")
    proc = reaper.python("-m", "submit", "job01", "--job-dir", str(tmp_path / "job"),
                         "--package-path", pkg, "--module-name", "fakejob.task",
                         "--config", _custom(tmp_path, workers=1, ps=1), cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    record = wait_for(lambda: (r := load_or_none("job01")) and r.state == "RUNNING" and r,
                      60, "the job to run")
    proc.kill()  # SIGKILL: no chance to clean up; PR_SET_PDEATHSIG does it
    proc.wait(10)
    wait_for(lambda: not any(pid_alive(r.pid) for r in record.replicas), 15,
             "the replicas to die with their launcher")
    listing = subprocess.run(_cli("jobs", "list"), cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
    assert "RUNNING?" in listing.stdout  # its supervisor is gone
    cancel = subprocess.run(_cli("jobs", "cancel", "job01"), cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert cancel.returncode == 0 and "Job [job01] CANCELLED." in cancel.stdout
    assert records.load("job01").state == records.CANCELLED


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_line_is_redrawn_only_on_a_tty():
    tty, pipe = _Tty(), io.StringIO()
    for out in (tty, pipe):
        terminal = logs.Terminal(out)
        terminal.state("RUNNING")
        text = "step 20/40 loss=0.5123 accuracy=0.8 examples/s=100.0 lr=0.001"
        terminal.line("master-replica-0", text, logs.format_line("master-replica-0", text))
        terminal.line("worker-replica-0", "step 1/2 loss=9", "worker line")
        terminal.close()
    assert "\r\033[K" in tty.getvalue()
    assert "RUNNING  step 20/40  loss 0.5123" in tty.getvalue()
    assert "\r" not in pipe.getvalue() and "step 20/40  loss" not in pipe.getvalue()
    assert pipe.getvalue().splitlines()[0].split("\t")[2:] == ["master-replica-0", text]


def test_jobs_commands_on_an_unknown_job(capsys):
    for argv in (["jobs", "describe", "nojob"], ["jobs", "cancel", "nojob"],
                 ["jobs", "stream-logs", "nojob"]):
        status, _, err = submit_in_process(capsys, *argv)
        assert status == 2 and "no job 'nojob' in the local index" in err
