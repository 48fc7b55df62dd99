"""Job records: state, timestamps, the resolved spec, replica PIDs, exit codes, restarts.

A record is JSON, written atomically to `<job-dir>/jobs/<job-id>.json` (any storage URL)
and to the local index `$MLJOB_HOME/jobs/<job-id>.json`, which `jobs list/describe/
stream-logs/cancel` read. Only the process supervising the job writes its record.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import psutil

from submit.errors import JobNotFoundError, SubmitError
from submit.package import mljob_home
from submit.spec import check_job_id
from mljob import contracts, procs, storage
from mljob.errors import first_line

QUEUED, PREPARING, RUNNING = "QUEUED", "PREPARING", "RUNNING"
SUCCEEDED, FAILED, CANCELLING, CANCELLED = "SUCCEEDED", "FAILED", "CANCELLING", "CANCELLED"
STATES = (QUEUED, PREPARING, RUNNING, SUCCEEDED, FAILED, CANCELLING, CANCELLED)
FINAL_STATES = (SUCCEEDED, FAILED, CANCELLED)


@dataclasses.dataclass
class ReplicaRecord:
    label: str
    pid: int | None = None
    state: str = "PENDING"           # PENDING, RUNNING, EXITED, STOPPED, RESTARTING
    exit_code: int | None = None
    restarts: int = 0
    stamp: dict | None = None        # procs.stamp of its current process: start, argv
    exit_codes: list[int] = dataclasses.field(default_factory=list)  # of every run, in order


@dataclasses.dataclass
class JobRecord:
    """One job as the index and `jobs describe` show it (mutated only by its supervisor)."""

    job_id: str
    state: str = QUEUED
    create_time: float = dataclasses.field(default_factory=time.time)
    start_time: float | None = None
    end_time: float | None = None
    job_dir: str | None = None
    scale_tier: str | None = None
    package_url: str | None = None
    package_sha256: str | None = None
    module: str | None = None
    trainer_args: list[str] = dataclasses.field(default_factory=list)
    training_input: dict[str, Any] = dataclasses.field(default_factory=dict)
    log_dir: str | None = None
    supervisor_pid: int | None = None
    supervisor_create_time: float | None = None
    supervisor_stamp: dict | None = None  # procs.stamp: start time and command line
    replicas: list[ReplicaRecord] = dataclasses.field(default_factory=list)
    error_message: str | None = None
    mode: str = "cloud"
    runner: str = "local"            # or a cluster engine: kubeflow, vertex
    engine: dict[str, Any] = dataclasses.field(default_factory=dict)  # the engine's handle
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    # Cloud ML's trainingOutput; for a tuning job its trials, best first (submit/tuning.py)
    training_output: dict[str, Any] = dataclasses.field(default_factory=dict)
    # CPU and memory per replica, peak and mean, sampled by the local supervisor
    usage: dict[str, Any] = dataclasses.field(default_factory=dict)
    # a batch prediction job's Cloud ML predictionInput and predictionOutput
    prediction_input: dict[str, Any] = dataclasses.field(default_factory=dict)
    prediction_output: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.state in FINAL_STATES

    def replica(self, label: str) -> ReplicaRecord:
        for r in self.replicas:
            if r.label == label:
                return r
        r = ReplicaRecord(label)
        self.replicas.append(r)
        return r

    def set_state(self, state: str, error: str | None = None) -> None:
        self.state = state
        if state == RUNNING and self.start_time is None:
            self.start_time = time.time()
        if state in FINAL_STATES:
            self.end_time = time.time()
        if error:
            self.error_message = error

    def adopt_supervisor(self, pid: int | None = None) -> None:
        """Record the supervising process: its PID, and its start time and command line
        (`procs.stamp`), against PID reuse and records naming another process."""
        pid = pid or os.getpid()
        self.supervisor_pid = pid
        self.supervisor_stamp = procs.stamp(pid)
        try:
            self.supervisor_create_time = psutil.Process(pid).create_time()
        except psutil.Error:
            self.supervisor_create_time = None

    def supervisor_alive(self) -> bool:
        """True only while the recorded supervisor is provably this job's: the same
        process (start time, command line) that holds the job's lock file open or, for a
        detached supervisor, carries the job id in its environment."""
        return procs.is_ours(self.supervisor_pid, self.supervisor_stamp,
                             env={contracts.MLJOB_JOB_ID_ENV: self.job_id},
                             open_file=lock_path(self.job_id))

    def running(self) -> bool:
        """Not ended, and (for a local job) its supervisor still there to end it."""
        return not self.done and (self.runner != "local" or self.supervisor_alive())

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> "JobRecord":
        data = json.loads(text)
        data["replicas"] = [ReplicaRecord(**r) for r in data.get("replicas", [])]
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def replica_lines(record: JobRecord) -> list[str]:
    """`jobs describe`'s readable lines: each replica's state, restarts and the exit
    status of every run (137: killed by SIGKILL)."""
    def runs(codes: list[int]) -> str:
        return ", ".join(str(c) for c in codes) if codes else "none ended yet"
    return [f"  {r.label}: {r.state}, {r.restarts} restart{'s' * (r.restarts != 1)}; "
            f"exit status of each run: {runs(r.exit_codes)}" for r in record.replicas]


def index_path(job_id: str) -> str:
    check_job_id(job_id)  # an id from the command line never becomes a path unchecked
    return os.path.join(mljob_home(), "jobs", f"{job_id}.json")


def lock_path(job_id: str) -> str:
    """The file a local job's supervisor holds open (and locked) while it runs."""
    check_job_id(job_id)
    return os.path.join(mljob_home(), "runs", job_id, "supervisor.lock")


def record_url(job_dir: str, job_id: str) -> str:
    check_job_id(job_id)
    return storage.join(job_dir, "jobs", f"{job_id}.json")


def save(record: JobRecord, *, create_in_job_dir: bool = True) -> None:
    """Publish the record to the index and the job dir (both atomically).

    create_in_job_dir=False updates the job dir's copy only where one already exists: a
    command that acts on a record it read (`jobs cancel`) never writes a new file in a
    folder that record names."""
    data = record.to_json().encode()
    storage.write_bytes(index_path(record.job_id), data)
    if record.job_dir:
        try:
            if create_in_job_dir or storage.exists(record_url(record.job_dir,
                                                              record.job_id)):
                storage.write_bytes(record_url(record.job_dir, record.job_id), data)
        except (storage.StorageError, OSError) as exc:
            text = first_line(exc)  # storage's errors name the URL already
            raise SubmitError(text if record.job_dir in text else
                              f"cannot write the job record to {record.job_dir}: {text}") \
                from None


def load(job_id: str) -> JobRecord:
    """The index's record of job_id (validated first: never a path outside the index)."""
    path = index_path(job_id)
    try:
        with open(path, "rb") as f:
            record = JobRecord.from_json(f.read())
    except FileNotFoundError:
        raise JobNotFoundError(f"no job {job_id!r} in the local index "
                               f"({os.path.dirname(path)}); see `python -m submit jobs "
                               "list`") from None
    except (ValueError, TypeError, AttributeError):
        raise SubmitError(f"the job record {path} is damaged; remove it") from None
    if record.job_id != job_id:
        raise SubmitError(f"the job record {path} names job {record.job_id!r:.60}, not "
                          f"{job_id!r}; remove it")
    return record


def list_all() -> list[JobRecord]:
    folder = os.path.join(mljob_home(), "jobs")
    records = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith(".json"):
            try:
                with open(os.path.join(folder, name), "rb") as f:
                    record = JobRecord.from_json(f.read())
            except (OSError, ValueError, TypeError, AttributeError):
                continue  # a foreign or damaged file is not a job
            if f"{record.job_id}.json" == name and isinstance(record.create_time, (int, float)):
                records.append(record)
    return sorted(records, key=lambda r: r.create_time)


def used_in_job_dir(job_dir: str, job_id: str) -> bool:
    try:
        return storage.exists(record_url(job_dir, job_id))
    except (storage.StorageError, OSError):
        return False

