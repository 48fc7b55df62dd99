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
from mljob import storage

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
    replicas: list[ReplicaRecord] = dataclasses.field(default_factory=list)
    error_message: str | None = None
    mode: str = "cloud"
    runner: str = "local"            # or a cluster engine: kubeflow, vertex
    engine: dict[str, Any] = dataclasses.field(default_factory=dict)  # the engine's handle
    # Cloud ML's trainingOutput; for a tuning job its trials, best first (submit/tuning.py)
    training_output: dict[str, Any] = dataclasses.field(default_factory=dict)

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
        """Record the supervising process (and its start time, against PID reuse)."""
        pid = pid or os.getpid()
        self.supervisor_pid = pid
        try:
            self.supervisor_create_time = psutil.Process(pid).create_time()
        except psutil.Error:
            self.supervisor_create_time = None

    def supervisor_alive(self) -> bool:
        if not self.supervisor_pid:
            return False
        try:
            proc = psutil.Process(self.supervisor_pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            return (self.supervisor_create_time is None
                    or abs(proc.create_time() - self.supervisor_create_time) < 1.0)
        except psutil.Error:
            return False

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


def index_path(job_id: str) -> str:
    return os.path.join(mljob_home(), "jobs", f"{job_id}.json")


def record_url(job_dir: str, job_id: str) -> str:
    return storage.join(job_dir, "jobs", f"{job_id}.json")


def save(record: JobRecord) -> None:
    """Publish the record to the index and the job dir (both atomically)."""
    data = record.to_json().encode()
    storage.write_bytes(index_path(record.job_id), data)
    if record.job_dir:
        try:
            storage.write_bytes(record_url(record.job_dir, record.job_id), data)
        except (storage.StorageError, OSError) as exc:
            raise SubmitError(f"cannot write the job record to {record.job_dir}: {exc}") \
                from None


def load(job_id: str) -> JobRecord:
    path = index_path(job_id)
    try:
        with open(path, "rb") as f:
            return JobRecord.from_json(f.read())
    except FileNotFoundError:
        raise JobNotFoundError(f"no job {job_id!r} in the local index "
                               f"({os.path.dirname(path)}); see `python -m submit jobs "
                               "list`") from None


def list_all() -> list[JobRecord]:
    folder = os.path.join(mljob_home(), "jobs")
    records = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith(".json"):
            try:
                with open(os.path.join(folder, name), "rb") as f:
                    records.append(JobRecord.from_json(f.read()))
            except (OSError, ValueError, TypeError):
                continue  # a foreign or damaged file is not a job
    return sorted(records, key=lambda r: r.create_time)


def used_in_job_dir(job_dir: str, job_id: str) -> bool:
    try:
        return storage.exists(record_url(job_dir, job_id))
    except (storage.StorageError, OSError):
        return False

