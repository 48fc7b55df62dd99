"""The Python API's jobs as a notebook uses them: `list_jobs(limit=N)` gives at most N;
`wait` (and `jobs wait`) returns with one line when the job's supervisor died without
ending it; an interrupt while following is the caller's; the job's curves from its own
summaries without TensorFlow; counts and trial parameters as numbers; progress lines
that an off switch silences."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time

import shutil

import pytest

from mljob import procs
from submit import api, resource
from submit.api import progress as api_progress
from submit import jobs as records
from tests.support.common import ROOT
from tests.support.submit_cli import write_package
from tests.support.summaries import GOLDEN

SLEEPER = "import time\nprint('started', flush=True)\ntime.sleep(300)\n"


def test_list_jobs_gives_at_most_limit(tmp_path):
    for i in range(4):
        records.save(records.JobRecord(f"limit{i}", state=records.SUCCEEDED,
                                       create_time=1_700_000_000 + i,
                                       job_dir=str(tmp_path / f"limit{i}")))
    assert [j.job_id for j in api.list_jobs()] == [f"limit{i}" for i in range(4)]
    assert [j.job_id for j in api.list_jobs(limit=2)] == ["limit0", "limit1"]
    assert [j.job_id for j in api.list_jobs(limit=1, sort_by="~createTime")] == ["limit3"]
    assert len(api.list_jobs(limit=10)) == 4


def _started(job: api.Job, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not any("started" in line for line in job.logs()):
        assert time.monotonic() < deadline, list(job.logs())
        assert not job.done, job.describe()
        time.sleep(0.3)


def test_wait_returns_when_the_supervisor_died_without_ending_the_job(tmp_path):
    """The supervisor SIGKILLed mid-job: `Job.wait()` and `jobs wait` each end with one
    line naming the cause and the fix, long before their timeout (a hang fails the
    test by the timeout, never holds it), and cancel then stops what was left."""
    job = api.submit("orphan01", package_path=write_package(tmp_path / "pkg", SLEEPER),
                     module_name="fakejob.task", job_dir=str(tmp_path / "orphan01"),
                     progress=False)
    try:
        _started(job)
        supervisor = job.record(refresh=False).supervisor_pid
        assert supervisor and procs.pid_alive(supervisor)
        os.kill(supervisor, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while procs.pid_alive(supervisor) and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(api.SubmitError, match="supervisor is gone and the job never "
                                                  "ended; cancel it") as raised:
            job.wait(timeout=60)
        assert not isinstance(raised.value, api.JobTimeout)
        done = subprocess.run([sys.executable, "-m", "submit", "jobs", "wait", "orphan01",
                               "--timeout", "60"], cwd=ROOT, capture_output=True,
                              text=True, timeout=180)
        assert done.returncode == 1 and "supervisor is gone" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    finally:
        if not job.done:
            job.cancel()
    record = records.load("orphan01")
    assert record.state == records.CANCELLED
    assert [r.pid for r in record.replicas if r.pid and procs.pid_alive(r.pid)] == []


@pytest.mark.slow
def test_an_interrupt_while_following_is_the_callers(tmp_path):
    """Ctrl-C (a notebook's stop) while `Job.follow()` follows: KeyboardInterrupt
    reaches the caller (the rest of the cell does not run on), the job goes on; the
    command line's `jobs stream-logs` still ends with status 130. SIGINT is Python's
    KeyboardInterrupt here and in the command (as in a terminal and in a kernel's cell)
    even when the test runs where a shell started it with SIGINT ignored."""
    restore = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _follow_interrupted(tmp_path)
    finally:
        signal.signal(signal.SIGINT, restore)


def _follow_interrupted(tmp_path) -> None:
    job = api.submit("follow01", package_path=write_package(tmp_path / "pkg", SLEEPER),
                     module_name="fakejob.task", job_dir=str(tmp_path / "follow01"),
                     progress=False)
    try:
        _started(job)
        lines: list[str] = []
        timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                job.follow(lines.append)
        finally:
            timer.cancel()
        assert any("started" in line for line in lines)
        assert lines[-1].startswith("Stopped following; job [follow01] goes on")
        assert job.state == "RUNNING"
        timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                for _ in job.logs(follow=True):
                    pass
        finally:
            timer.cancel()
        assert job.state == "RUNNING"
        cli = subprocess.Popen([sys.executable, "-m", "submit", "jobs", "stream-logs",
                                "follow01"], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        try:
            assert "started" in cli.stdout.readline() + cli.stdout.readline()
            cli.send_signal(signal.SIGINT)
            assert cli.wait(60) == 130
        finally:
            procs.stop_process(cli, own_group=False)
    finally:
        job.cancel()


def test_metrics_are_every_scalar_by_run_tag_and_step_without_tensorflow(tmp_path):
    """Read from event files TensorFlow's summary writer wrote (tests/golden/summaries:
    train and eval runs, loss and accuracy), in a process of its own to see what it
    loaded."""
    records.save(records.JobRecord("curves03", state=records.SUCCEEDED,
                                   job_dir=str(tmp_path / "curves03")))
    code = ("import json, sys\nfrom submit import api\n"
            "rows = api.get_job('curves03').metrics()\n"
            "print(json.dumps(rows))\nprint('tensorflow' in sys.modules)\n")
    empty = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                           text=True, timeout=120, env=dict(os.environ))
    assert empty.stdout.splitlines() == ["[]", "False"], empty.stderr
    shutil.copytree(GOLDEN, tmp_path / "curves03" / "summaries")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    rows_text, loaded = done.stdout.splitlines()
    rows = json.loads(rows_text)
    assert loaded == "False"  # the reader never loaded TensorFlow into the process
    assert rows == sorted(rows, key=lambda r: (r["run"], r["tag"], r["step"]))
    assert {r["run"] for r in rows} == {"train", "eval"}
    assert all(set(r) == {"run", "tag", "step", "value"} and isinstance(r["step"], int)
               and isinstance(r["value"], float) for r in rows)
    from submit.query import curves
    series = curves.JobCurves(str(tmp_path / "curves03")).read()
    assert {(r["tag"], r["run"], r["step"]): r["value"] for r in rows} == {
        (tag, run, step): value for tag, runs in series.items()
        for run, points in runs.items() for step, value in points.items()}
    assert done.stderr == ""  # no third-party warnings in the cell


def test_counts_steps_and_trial_parameters_come_back_as_numbers():
    described = {
        "trainingInput": {"workerCount": "2", "parameterServerCount": "1",
                          "masterConfig": {"acceleratorConfig": {"count": "1"}},
                          "args": ["--train-steps", "100"], "region": "us-central1"},
        "trainingOutput": {"completedTrialCount": "2", "trials": [
            {"trialId": "1", "hyperparameters": {"lr": "0.01", "layers": "3",
                                                 "optimizer": "adam", "decay": "1e-05"},
             "finalMetric": {"trainingStep": "1000", "objectiveValue": 0.9}}]},
        "predictionOutput": {"predictionCount": "6", "errorCount": "0",
                             "nodeHours": 0.01}}
    typed = resource.with_numbers(described)
    assert typed["trainingInput"]["workerCount"] == 2
    assert typed["trainingInput"]["masterConfig"]["acceleratorConfig"]["count"] == 1
    assert typed["trainingInput"]["args"] == ["--train-steps", "100"]  # text stays text
    trial = typed["trainingOutput"]["trials"][0]
    assert trial["trialId"] == "1"  # an id, not a number
    assert trial["hyperparameters"] == {"lr": 0.01, "layers": 3, "optimizer": "adam",
                                        "decay": 1e-05}
    assert trial["finalMetric"]["trainingStep"] == 1000
    assert typed["trainingOutput"]["completedTrialCount"] == 2
    assert typed["predictionOutput"]["predictionCount"] == 6


def test_progress_lines_and_the_off_switch(monkeypatch):
    out = io.StringIO()
    clock = iter([0.0, 1.0, 2.0, 20.0, 41.0, 90.0]).__next__
    shown = api_progress.Progress("job01", on=True, stream=out, clock=clock)
    shown.note("Packaging the trainer\nJob [job01] submitted successfully to local.")
    shown.job("PREPARING")
    shown.job("RUNNING", 10, 100)
    shown.job("RUNNING", 12, 100)      # the same state within LINE_EVERY_S: no line
    shown.job("RUNNING", 60, 100)      # LINE_EVERY_S later: a line
    shown.job("SUCCEEDED", 100, 100)
    assert out.getvalue().splitlines() == [
        "[job01] Packaging the trainer",
        "[job01] Job [job01] submitted successfully to local.",
        "[job01] PREPARING after 1 s", "[job01] RUNNING, step 10/100 after 2 s",
        "[job01] RUNNING, step 60/100 after 41 s",
        "[job01] SUCCEEDED, step 100/100 after 90 s"]
    monkeypatch.setenv("MLJOB_PROGRESS", "0")
    assert not api_progress.enabled(None) and api_progress.enabled(True)
    monkeypatch.delenv("MLJOB_PROGRESS")
    assert api_progress.enabled(None) and not api_progress.enabled(False)
    assert api_progress._train_steps(["--lr", "0.1", "--train-steps", "300"]) == 300
    assert api_progress._train_steps(["--train_steps=40"]) == 40
    assert api_progress._train_steps(["--steps", "3"]) is None


def test_an_endpoints_server_finds_the_project():
    """The server is `python -m predict` with the project first on its path (the
    folder that holds predict/ and submit/, never a package inside it, whose
    `packaging` would hide the distribution TensorFlow imports)."""
    from submit.api import endpoint
    assert sorted(n for n in os.listdir(endpoint.ROOT) if n in ("predict", "submit")) == [
        "predict", "submit"]
