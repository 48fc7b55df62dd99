"""scheduling.maxRunningTime and maxWaitTime in the local runner: a job whose replicas
would run for minutes ends FAILED at its deadline, with Cloud ML's kind of message and
every replica stopped by PID."""
from __future__ import annotations

import pytest

from tests.support.common import pid_alive
from tests.support.submit_cli import run, write_package
from submit import jobs as records

FOREVER = "import time\ntime.sleep(600)\n"   # every replica: training that takes minutes


@pytest.fixture
def forever(tmp_path):
    return write_package(tmp_path / "forever", FOREVER)


def submit(capsys, tmp_path, package, job_id, scheduling):
    config = tmp_path / f"{job_id}.yaml"
    config.write_text("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
                      "  workerCount: 1\n  parameterServerCount: 1\n"
                      f"  scheduling: {scheduling}\n")
    return run(capsys, job_id, "--job-dir", str(tmp_path / job_id), "--package-path",
               package, "--module-name", "fakejob.task", "--config", str(config))


@pytest.mark.slow  # kept out of the default run's 15 minutes; CI runs it
def test_max_running_time_fails_the_job_and_stops_every_replica(capsys, tmp_path, forever):
    status, out, err = submit(capsys, tmp_path, forever, "deadline",
                              "{maxRunningTime: 30s}")
    record = records.load("deadline")
    assert status == 1 and record.state == records.FAILED
    assert "exceeded its maximum running time of 30s" in record.error_message
    assert err.startswith("error: job deadline failed: The job exceeded its maximum "
                          "running time of 30s") and err.count("\n") == 1
    assert "Job [deadline] FAILED." in out
    # the deadline counts from RUNNING; the job is stopped at it, not minutes later
    assert 30 <= record.end_time - record.start_time < 60
    pids = [r.pid for r in record.replicas]
    assert len(pids) == 3 and all(pids)
    assert [p for p in pids if pid_alive(p)] == []
    assert {r.state for r in record.replicas} == {"STOPPED"}


def test_max_wait_time_fails_a_job_that_was_not_running_in_time(capsys, tmp_path,
                                                                 forever):
    """Preparing the package environment (a pip install) takes longer than 0.001 s, so the
    job fails before any replica starts."""
    status, out, err = submit(capsys, tmp_path, forever, "waited",
                              "{maxWaitTime: 0.001s}")
    record = records.load("waited")
    assert status == 1 and record.state == records.FAILED
    assert "did not start running within its maximum wait time of 0.001s" in err
    assert record.start_time is None
    assert all(r.pid is None for r in record.replicas)
