"""What the local runner's verbs (`submit.runners.local`) call in the local wing: the
checks only this machine makes, a job run to its end (a plain job by its `Supervisor`,
a tuning job by its `Tuner`: the entry picks by the plan's tuning spec; a batch
prediction job runs its `PredictionJob` under `supervise` too, from
`submit.prediction.job.run`), and a job stopped from another process.

The process that runs a job (the submitting one when attached, `python -m submit
_supervise KIND FILE` when detached, started by `detach`), for every kind of job
supervised here (`supervise`), holds the job's lock file open and locked throughout and
owns its record: `jobs cancel` signals the recorded PID only when that process holds the
lock (see `procs.is_ours`), and writes the record itself only when the supervisor is
gone.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from mljob import contracts, procs
from submit import jobs, logs
from submit.errors import SubmitError, UsageError
from submit.local.plan import JobPlan
from submit.local.supervisor import Supervisor
from submit.jobdef.spec import JobSpec

# `jobs cancel`: how long the supervisor gets to stop the job (a stopping chief gets its
# stop deadline to save, 60 s by default, then workers and ps their grace)
CANCEL_WAIT_S = 90.0
MAX_PARALLEL_TRIALS = 16   # tuning trials at once, each a job of its own on this machine
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T = TypeVar("T")


def check(spec: JobSpec) -> None:
    """A tuning job the local tuner cannot run: Optuna missing, more trials at once than
    this machine takes, or an earlier study that cannot be continued."""
    hp = spec.tuning
    if hp is None:
        return
    from submit.local import resume, study
    study.check_installed()
    if hp.max_parallel_trials > MAX_PARALLEL_TRIALS:
        raise UsageError(
            f"trainingInput.hyperparameters.maxParallelTrials "
            f"{hp.max_parallel_trials} is more than the local runner's limit of "
            f"{MAX_PARALLEL_TRIALS} trials at once (each is a job on this "
            "machine); lower it, or use --runner vertex or kubeflow")
    if hp.resume_from:
        resume.check_resumable(hp.resume_from)


def run(plan: JobPlan, record: jobs.JobRecord, *, stream: bool) -> str:
    """Run a job to its end in this process, which becomes its supervisor; the final
    state (also in `record`)."""
    def work(terminal: logs.Terminal) -> str:
        if plan.tuning is not None:  # a tuning job: trials of this plan
            from submit.local.tuner import Tuner  # Optuna's, only for a study
            return Tuner(plan, record, terminal=terminal).run()
        return Supervisor(plan, record, publish=jobs.save, terminal=terminal).run()
    return supervise(record, work, stream=stream)


def supervise(record: jobs.JobRecord, work: Callable[[logs.Terminal], T], *,
              stream: bool) -> T:
    """Run `work` in this process as the job's supervisor, for every kind of job
    supervised here (a plain or tuning job, a tuning job on Ray, a batch prediction
    job): the job's lock held throughout, the record adopted (this PID) and saved
    first, the job's lines on a terminal (streamed when attached)."""
    lock = hold_lock(record.job_id)
    try:
        record.adopt_supervisor()
        jobs.save(record)
        return work(logs.Terminal(sys.stdout, stream=stream))
    finally:
        lock.close()


def detach(kind: str, job_id: str, run_dir: str, body_file: str) -> int:
    """Start the job's supervisor in a session of its own, `python -m submit _supervise
    KIND BODY_FILE` (KIND: job, ray-tuning, prediction), its output in the run folder's
    supervisor.log and the job's marker in its environment; its PID. The job's record is
    saved before: the supervisor reads it."""
    env = {**os.environ, contracts.MLJOB_JOB_ID_ENV: job_id,  # its marker
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(os.path.join(run_dir, "supervisor.log"), "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "submit", "_supervise", kind, body_file], cwd=run_dir,
            env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    return proc.pid


def hold_lock(job_id: str):
    """The job's lock file, open and locked by this process (closing it releases it)."""
    import fcntl
    path = jobs.lock_path(job_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lock = open(path, "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise UsageError(f"job {job_id!r} is already being supervised by another process; "
                         f"cancel it with `python -m submit jobs cancel {job_id}`") from None
    return lock


def cancel(job_id: str) -> str:
    """SIGTERM the job's supervisor, which stops every replica and records CANCELLED;
    when it is gone, stop what it left and record CANCELLED here. The state recorded."""
    record = jobs.load(job_id)
    if record.supervisor_alive():
        assert record.supervisor_pid is not None  # supervisor_alive checked the PID
        os.kill(record.supervisor_pid, signal.SIGTERM)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while not record.done and record.supervisor_alive() \
                and time.monotonic() < deadline:
            time.sleep(0.2)
            record = jobs.load(job_id)
        if not record.done and record.supervisor_alive():
            raise SubmitError(f"job {job_id!r} is still {record.state} after "
                              f"{CANCEL_WAIT_S:.0f} s; its supervisor is pid "
                              f"{record.supervisor_pid}")
    record = jobs.load(job_id)  # the supervisor may have finished while we looked
    if not record.done:  # the supervisor died without cleaning up: stop what it left
        _kill_orphans(record)
        record.set_state(jobs.CANCELLED, "the supervisor was gone; replicas stopped")
        jobs.save(record, create_in_job_dir=False)
    return record.state


def _kill_orphans(record: jobs.JobRecord) -> None:
    """SIGKILL the replicas a dead supervisor left, each only if it is provably this
    job's: the recorded process (start time, command line) with the job's id and its
    supervisor's PID in its environment. A record naming any other process signals
    nothing."""
    for replica in record.replicas:
        marker = {contracts.JOB_ID_ENV: record.job_id,
                  contracts.PARENT_PID_ENV: str(record.supervisor_pid)}
        if procs.is_ours(replica.pid, replica.stamp, env=marker):
            assert replica.pid is not None  # is_ours checked the PID
            try:
                os.killpg(replica.pid, signal.SIGKILL)  # it leads its own session
            except (ProcessLookupError, PermissionError):
                pass
