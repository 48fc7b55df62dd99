"""Hostile input to `jobs describe / cancel / stream-logs`: job ids that are paths, and
records (crafted, or stale) naming processes mljob did not start. Nothing outside the
job index is read or written, and no such process is signalled."""
from __future__ import annotations

import json
import os
import subprocess

import psutil
import pytest

from mljob import procs
from submit import jobs as records
from tests.support.submit_cli import files_under, one_error_line, run


@pytest.fixture
def sleeper(reaper):
    """An unrelated live process: what a crafted record names."""
    proc = reaper.popen(["sleep", "300"])
    yield proc
    assert proc.poll() is None, "the unrelated process was signalled"


def crafted_record(path, job_id: str, pid: int, job_dir) -> bytes:
    """A record that names `pid` as its supervisor and its replica, stamped exactly as
    mljob stamps its own processes, so that only the job's marker can tell them apart."""
    stamp = procs.stamp(pid)
    data = {"job_id": job_id, "state": "RUNNING", "create_time": 1.0,
            "job_dir": str(job_dir), "log_dir": str(job_dir), "runner": "local",
            "supervisor_pid": pid, "supervisor_stamp": stamp,
            "supervisor_create_time": psutil.Process(pid).create_time(),
            "replicas": [{"label": "master-replica-0", "pid": pid, "state": "RUNNING",
                          "stamp": stamp}]}
    text = json.dumps(data).encode()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(text)
    return text


@pytest.mark.parametrize("command", ["describe", "cancel", "stream-logs"])
@pytest.mark.parametrize("job_id", ["../evil", "jobs/../../evil", "evil\n", "/tmp/evil"])
def test_a_path_like_job_id_reads_and_signals_nothing(capsys, tmp_path, sleeper, command,
                                                      job_id):
    home = os.environ["MLJOB_HOME"]
    outside = os.path.join(home, "evil.json")  # where jobs/../evil.json would point
    text = crafted_record(outside, "evil", sleeper.pid, tmp_path / "victim")
    status, out, err = run(capsys, "jobs", command, job_id)
    assert status == 2
    assert "invalid job id" in one_error_line(err) and out == ""
    with open(outside, "rb") as f:
        assert f.read() == text
    assert files_under(tmp_path / "victim") == []


def test_a_crafted_record_naming_another_process_signals_nothing(capsys, tmp_path,
                                                                 sleeper):
    index = os.path.join(os.environ["MLJOB_HOME"], "jobs", "evil.json")
    crafted_record(index, "evil", sleeper.pid, tmp_path / "victim")
    record = records.load("evil")
    assert not record.supervisor_alive()  # the same PID, start time and argv: not ours

    status, out, err = run(capsys, "jobs", "describe", "evil")
    assert status == 0 and "supervisorGone: true" in out and "state: RUNNING" in out
    status, out, err = run(capsys, "jobs", "list")
    assert status == 0 and "RUNNING?" in out
    status, out, err = run(capsys, "jobs", "cancel", "evil")
    assert status == 0, err
    assert "Job [evil] CANCELLED." in out
    assert sleeper.poll() is None
    assert files_under(tmp_path / "victim") == []  # no record written where it points
    assert records.load("evil").state == records.CANCELLED


def test_a_record_whose_id_differs_from_its_file_name_is_refused(capsys, tmp_path,
                                                                 sleeper):
    index = os.path.join(os.environ["MLJOB_HOME"], "jobs", "mine.json")
    crafted_record(index, "../../elsewhere", sleeper.pid, tmp_path / "victim")
    for command in ("describe", "cancel"):
        status, out, err = run(capsys, "jobs", command, "mine")
        assert status == 1
        assert "names job '../../elsewhere', not 'mine'" in one_error_line(err)
    status, out, err = run(capsys, "jobs", "list")
    assert status == 0 and "elsewhere" not in out
    assert files_under(tmp_path / "victim") == []


def test_a_damaged_record_is_one_line(capsys):
    index = os.path.join(os.environ["MLJOB_HOME"], "jobs", "broken.json")
    os.makedirs(os.path.dirname(index))
    for text in ("{not json", '{"job_id": "broken", "replicas": [{"bogus": 1}]}', "[1]"):
        with open(index, "w") as f:
            f.write(text)
        status, _, err = run(capsys, "jobs", "describe", "broken")
        line = one_error_line(err)
        assert status == 1 and f"record {index} is damaged (" in line
        assert line.endswith("; remove it")


def test_is_ours_needs_the_same_process_and_its_marker(reaper):
    proc = reaper.popen(["sleep", "300"], env={**os.environ, "MLJOB_JOB_ID": "job01"})
    stamp = procs.stamp(proc.pid)
    assert procs.is_ours(proc.pid, stamp, env={"MLJOB_JOB_ID": "job01"})
    assert not procs.is_ours(proc.pid, stamp, env={"MLJOB_JOB_ID": "job02"})
    assert not procs.is_ours(proc.pid, stamp)  # no marker asked: never ours
    assert not procs.is_ours(proc.pid, {**stamp, "started": stamp["started"] - 0.01},
                             env={"MLJOB_JOB_ID": "job01"})
    assert not procs.is_ours(proc.pid, {**stamp, "cmdline": ["sleep", "301"]},
                             env={"MLJOB_JOB_ID": "job01"})
    for pid in (None, "1", True, -1, 0):
        assert not procs.is_ours(pid, stamp, env={"MLJOB_JOB_ID": "job01"})
    lock = reaper.popen(["python3", "-c", "import sys, time; f = open(sys.argv[1]); "
                         "print(1, flush=True); time.sleep(300)", __file__],
                        stdout=subprocess.PIPE)
    lock.stdout.readline()
    assert procs.is_ours(lock.pid, procs.stamp(lock.pid), open_file=__file__)
    assert not procs.is_ours(proc.pid, stamp, open_file=__file__)
    reaper.stop(proc)
    assert not procs.is_ours(proc.pid, stamp, env={"MLJOB_JOB_ID": "job01"})
