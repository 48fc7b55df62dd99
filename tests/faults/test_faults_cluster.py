"""Replica failures under ParameterServerStrategy, through the real launcher.

Each job is `python -m submit JOB --scale-tier CUSTOM --config (chief + 2 workers + 1 ps)
--restart-policy ExitCode`, training the MLP with a fixed seed (Fashion-MNIST where
installed, else the packaged sample).
A test kills one replica (by the PID in the job record) part-way, and checks:

- the job still SUCCEEDS and the chief's last line says `training finished: step=TOTAL`,
  and the newest checkpoint is step TOTAL and every kept checkpoint restores;
- a chief stopped between steps (SIGTERM, exit 143) resumes exactly where it stopped;
  a chief or ps lost mid-step resumes from the newest checkpoint;
- the export is as accurate as the undisturbed baseline's with the same flags (shared
  by the module) within one point, on the data's test set;
- no process of the job outlives it: every PID ever recorded is dead afterwards.

Timeouts bound every wait; nothing here measures speed.
"""
from __future__ import annotations

import glob
import os
import re
import signal

import pytest

from tests.support.common import ROOT, Reaper, pid_alive
from tests.support.trainer_runs import export_accuracy, read, wait_exit, wait_for

from tests.support.faults import ACCURACY_POINTS, ARGS, CONFIG, DATA, JOB_TIMEOUT, \
    STEP_TIMEOUT, TOTAL, Job, check_restorable, checkpoint_steps  # noqa: F401


def restarts(record: dict) -> dict[str, int]:
    return {r["label"]: r["restarts"] for r in record["replicas"]}


def started_steps(job: Job) -> list[int]:
    return [int(re.search(r" step=(\d+) ", t).group(1))
            for t in job.chief_lines("training started:")]


@pytest.fixture(scope="module")
def baselines(tmp_path_factory):
    """The undisturbed job's export accuracy for the given trainer flags (how the workers
    update the ps: each way trains to its own accuracy), run once for the module when
    first asked for."""
    reaper = Reaper()
    found: dict[tuple, float] = {}

    def accuracy(extra: tuple = ()) -> float:
        if extra not in found:
            job = Job(reaper, tmp_path_factory.mktemp("baseline"), f"baseline{len(found)}",
                      extra=extra)
            record = job.finish()
            assert set(restarts(record).values()) == {0}
            assert started_steps(job) == [0]
            found[extra] = export_accuracy(os.path.join(job.job_dir, "model"), DATA)
        return found[extra]

    try:
        yield accuracy
    finally:
        reaper.stop_all()


@pytest.fixture(scope="module")
def baseline(baselines) -> float:
    """The undisturbed job's export accuracy with the trainer's defaults."""
    return baselines()


def check_accuracy(job: Job, baseline: float) -> None:
    accuracy = export_accuracy(os.path.join(job.job_dir, "model"), DATA)
    print(f"accuracy: {accuracy:.3f} (undisturbed {baseline:.3f})")
    assert abs(accuracy - baseline) <= ACCURACY_POINTS, (accuracy, baseline)


@pytest.mark.parametrize("updates", [
    # the defaults: local steps, bfloat16 on the wire (test_faults_restarts kills a
    # worker in the default run; this one, with its baseline, runs with the slow tests)
    pytest.param((), marks=pytest.mark.slow, id="defaults"),
    pytest.param(("--no-ps-local-steps",), marks=pytest.mark.slow, id="step by step"),
    pytest.param(("--ps-wire-dtype", "float32"), marks=pytest.mark.slow, id="float32 wire"),
], ids=lambda updates: "defaults" if not updates else None)
def test_killed_worker_is_restarted_and_the_job_finishes(reaper, tmp_path, baselines, updates):
    job = Job(reaper, tmp_path, "worker_kill", extra=updates)
    job.wait_step(200)
    first = job.kill("worker-replica-0", signal.SIGKILL)
    # The coordinator goes on with worker 1 by itself ...
    job.wait_step(job.last_step() + 100)
    # ... then the chief is paused until the launcher has the dead worker serving again
    # (same TF_CONFIG, same address, new PID), so the rest of the training overlaps its
    # return on any machine.
    chief = job.running_pid("master-replica-0")
    os.kill(chief, signal.SIGSTOP)
    try:
        job.running_pid("worker-replica-0", other_than=first)
        log = os.path.join(job.job_dir, "logs", "worker-replica-0.log")
        address = re.search(r"serving worker 0 at (\S+)", read(log)).group(1)
        wait_for(lambda: read(log).count(f"serving worker 0 at {address}") == 2, 120,
                 "the restarted worker serving on the same address")
    finally:
        os.kill(chief, signal.SIGCONT)
    assert job.last_step() < TOTAL
    record = job.finish()
    # The coordinator kept going: the chief never restarted.
    assert restarts(record) == {"master-replica-0": 0, "worker-replica-0": 1,
                                "worker-replica-1": 0, "ps-replica-0": 0}
    assert started_steps(job) == [0]
    check_accuracy(job, baselines(updates))


@pytest.mark.slow  # about a minute: kept out of the default run, run by .ci/run
def test_killed_ps_restarts_ps_and_chief_from_the_latest_checkpoint(reaper, tmp_path,
                                                                    baseline):
    job = Job(reaper, tmp_path, "ps_kill")
    job.wait_step(300)
    job.kill("ps-replica-0", signal.SIGKILL)
    wait_for(lambda: job.replica("master-replica-0").get("restarts", 0) >= 1, 120,
             "the chief restarted")
    assert "ps-replica-0 (127.0.0.1:" in "\n".join(job.chief_lines("error:"))
    record = job.finish()
    assert {r["label"]: r["exit_code"] for r in record["replicas"]}["master-replica-0"] == 0
    assert restarts(record)["ps-replica-0"] == 1
    assert restarts(record)["master-replica-0"] >= 1
    assert [line for line in job.chief_lines("error:") if "stopped answering" in line]
    starts = started_steps(job)
    assert starts[0] == 0 and 100 <= starts[-1] < TOTAL and starts[-1] % 100 == 0
    check_accuracy(job, baseline)


@pytest.mark.slow  # about a minute: kept out of the default run, run by .ci/run
def test_chief_preempted_then_killed_resumes_without_losing_a_step(reaper, tmp_path,
                                                                  baseline):
    job = Job(reaper, tmp_path, "chief_faults")
    # SIGTERM (preemption, between steps): the chief saves and exits 143.
    job.wait_step(200)
    job.kill("master-replica-0", signal.SIGTERM)
    wait_for(lambda: "master-replica-0 exited with status 143; restarting" in read(job.out),
             60, "the launcher restarting the chief after its exit 143")
    stopped = wait_for(lambda: job.chief_lines("error: stopped at step "), 30,
                       "the chief's stop line")
    stopped_at = int(re.match(r"error: stopped at step (\d+)", stopped[-1]).group(1))
    lines = job.chief_lines()
    starts = [i for i, t in enumerate(lines) if t.startswith("training started:")]
    first_run = lines[:starts[1]] if len(starts) > 1 else lines
    logged = max(int(re.match(r"step (\d+)/", t).group(1))
                 for t in first_run if t.startswith("step "))
    assert stopped_at >= logged >= 200
    wait_for(lambda: len(started_steps(job)) >= 2, STEP_TIMEOUT, "the chief's restart")
    assert started_steps(job)[1] == stopped_at  # exactly: no completed step lost
    # SIGKILL (mid-step): the next start resumes from the newest checkpoint.
    job.wait_step(stopped_at + 200)
    job.kill("master-replica-0", signal.SIGKILL)
    # Newest by its index file (written after the data): what the chief restores, even
    # when the kill came before the state file named it.
    newest = max(int(re.search(r"ckpt-(\d+)\.index$", p).group(1)) for p in
                 glob.glob(os.path.join(job.job_dir, "checkpoints", "ckpt-*.index")))
    assert newest > stopped_at
    record = job.finish()
    assert started_steps(job) == [0, stopped_at, newest]
    # Workers and ps served the new chief as they were: not restarted.
    assert restarts(record) == {"master-replica-0": 2, "worker-replica-0": 0,
                                "worker-replica-1": 0, "ps-replica-0": 0}
    check_accuracy(job, baseline)


ONE_WORKER = ("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
              "  workerCount: 1\n  parameterServerCount: 1\n")


@pytest.mark.slow  # a chief, a worker and a ps started, trained briefly and cancelled
def test_a_cancelled_ps_job_keeps_every_step_it_logged(reaper, tmp_path):
    """`jobs cancel` (as the console's Cancel, maxRunningTime and an early-stopped trial,
    through the same stop) stops the chief first, while the ps still serves: it saves the
    step it reached and exits 143. Stopped all at once, the chief lost the steps since its
    last checkpoint (`ps-replica-0 stopped answering`, exit 200)."""
    import subprocess
    import sys
    # no periodic checkpoint after the first: only the save on the stop can hold the
    # steps logged
    job = Job(reaper, tmp_path, "cancelled", cluster=ONE_WORKER,
              extra=("--checkpoint-every", "100000"))
    job.wait_step(100)
    pids = {r["label"]: r["pid"] for r in job.record()["replicas"]}
    cancel = subprocess.run([sys.executable, "-m", "submit", "jobs", "cancel", "cancelled"],
                            capture_output=True, text=True, timeout=120, env=job.env,
                            cwd=ROOT)
    assert cancel.returncode == 0 and "Job [cancelled] CANCELLED." in cancel.stdout, \
        cancel.stderr
    assert wait_exit(job.proc, 60, job.out) == 130   # the streaming submit: cancelled
    record = job.record()
    assert record["state"] == "CANCELLED"
    exits = {r["label"]: r["exit_codes"] for r in record["replicas"]}
    assert exits["master-replica-0"] == [143], (exits, read(job.out)[-3000:])
    logged = job.last_step()
    newest = checkpoint_steps(job.job_dir)[-1]
    print(f"last step logged {logged}, newest checkpoint {newest}")
    assert newest >= logged >= 100
    assert not [t for t in job.chief_lines("error:") if "stopped answering" in t]
    # the order, as the job's service lines tell it: the chief had stopped before the
    # worker and the ps were asked to
    service = read(os.path.join(job.job_dir, "logs", "service.log"))
    events = [line.split("\t", 3)[-1] for line in service.splitlines()]
    order = ["stopping master-replica-0 (SIGTERM)", "master-replica-0 stopped with status 143",
             "stopping worker-replica-0 (SIGTERM)", "stopping ps-replica-0 (SIGTERM)"]
    assert [e for e in events if e in order] == order, events
    check_restorable(job.job_dir)
    assert [p for p in {*pids.values(), *job.pids} if pid_alive(p)] == []
