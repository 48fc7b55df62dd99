"""Job records: state, timestamps, the resolved spec, replica PIDs, exit codes, restarts.

A record is JSON, written atomically to `<job-dir>/jobs/<job-id>.json` (any storage URL)
and to the local index `$MLJOB_HOME/jobs/<job-id>.json`, which `jobs list/describe/
stream-logs/cancel` read. Only the process supervising the job writes its record.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import stat
import time
from typing import Any

import psutil

from submit import record_values
from submit.errors import JobNotFoundError, SubmitError, UsageError
from submit.home import mljob_home
from submit.jobdef.spec import check_job_id
from mljob import contracts, procs, storage
from mljob.errors import first_line

QUEUED, PREPARING, RUNNING = "QUEUED", "PREPARING", "RUNNING"
SUCCEEDED, FAILED, CANCELLING, CANCELLED = "SUCCEEDED", "FAILED", "CANCELLING", "CANCELLED"
STATES = (QUEUED, PREPARING, RUNNING, SUCCEEDED, FAILED, CANCELLING, CANCELLED)
FINAL_STATES = (SUCCEEDED, FAILED, CANCELLED)
log = logging.getLogger(__name__)


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
        """Not ended, and (for a job supervised here: a local job, a study of Ray
        trials) its supervisor still there to end it."""
        supervised = self.runner == "local" or self.supervisor_pid is not None
        return not self.done and (not supervised or self.supervisor_alive())

    def refuse_if_running(self) -> None:
        """A job id still running is not submitted again: one line naming the fix."""
        if self.running():
            raise UsageError(f"job {self.job_id!r} is still {self.state}; cancel it with "
                             f"`python -m submit jobs cancel {self.job_id}` or pick "
                             "another id")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> "JobRecord":
        """The record, or ValueError saying what is wrong with a hand-edited or foreign
        one (the commands that read every record use the fields unchecked)."""
        try:
            data = json.loads(text)
        except RecursionError:  # json's parser recurses per level
            raise ValueError("it is nested too deep to be a job record") from None
        check_record(data)
        data["replicas"] = [ReplicaRecord(**{k: v for k, v in r.items() if k in _REPLICA})
                            for r in data.get("replicas", [])]
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def replica_lines(record: JobRecord) -> list[str]:
    """`jobs describe`'s readable lines: each replica's state, restarts and the exit
    status of every run (137: killed by SIGKILL)."""
    def runs(codes: list[int]) -> str:
        return ", ".join(str(c) for c in codes) if codes else "none ended yet"
    return [f"  {r.label}: {r.state}, {r.restarts} restart{'s' * (r.restarts != 1)}; "
            f"exit status of each run: {runs(r.exit_codes)}" for r in record.replicas]


_REPLICA = {f.name for f in dataclasses.fields(ReplicaRecord)}
_TYPES: dict[str, tuple] = {
    "job_id": (str,), "state": (str,), "create_time": (int, float),
    "start_time": (int, float, type(None)), "end_time": (int, float, type(None)),
    "job_dir": (str, type(None)), "scale_tier": (str, type(None)),
    "module": (str, type(None)), "runner": (str,), "mode": (str,),
    "trainer_args": (list,), "training_input": (dict,), "engine": (dict,),
    "labels": (dict,), "training_output": (dict,), "replicas": (list,),
    "error_message": (str, type(None)), "log_dir": (str, type(None)),
    "package_url": (str, type(None)), "supervisor_pid": (int, type(None)),
    "usage": (dict,), "prediction_input": (dict,), "prediction_output": (dict,)}


def check_record(data: Any) -> None:
    """ValueError naming the first field of a stored record that is not what the
    commands expect (a state that is null, a start time that is a string, labels that
    are a list, trials that are not objects)."""
    if not isinstance(data, dict):
        raise ValueError(f"it holds a JSON {type(data).__name__}, not a job object")
    for key, types in _TYPES.items():
        if key in data and (not isinstance(data[key], types) or
                            isinstance(data[key], bool) and bool not in types):
            raise ValueError(f"its {key} is {json.dumps(data[key])[:40]}")
    if "job_id" not in data:
        raise ValueError("it has no job_id")
    if data.get("state", QUEUED) not in STATES:
        raise ValueError(f"its state {data['state']!r:.40} is not one of {', '.join(STATES)}")
    if not all(isinstance(k, str) and isinstance(v, str)
               for k, v in data.get("labels", {}).items()):
        raise ValueError("its labels are not strings")
    if not all(isinstance(r, dict) and isinstance(r.get("label"), str)
               for r in data.get("replicas", [])):
        raise ValueError("its replicas are not objects with a label")
    trials = data.get("training_output", {}).get("trials", [])
    if not isinstance(trials, list) or not all(
            isinstance(t, dict) and isinstance(t.get("trialId"), (str, int))
            and isinstance(t.get("state", ""), str)
            and isinstance(t.get("hyperparameters", {}), dict)
            and isinstance(t.get("finalMetric") or {}, dict) for t in trials):
        raise ValueError("its trainingOutput.trials are not trial objects")
    record_values.check_values(data)  # then the values: times, counts, trials


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
        record = JobRecord.from_json(_read_regular(path))
    except FileNotFoundError:
        raise JobNotFoundError(f"no job {job_id!r} in the local index "
                               f"({os.path.dirname(path)}); see `python -m submit jobs "
                               "list`") from None
    except (ValueError, TypeError, AttributeError) as exc:
        raise SubmitError(f"the job record {path} is damaged ({_why(exc)}); remove it") \
            from None
    if record.job_id != job_id:
        raise SubmitError(f"the job record {path} names job {record.job_id!r:.60}, not "
                          f"{job_id!r}; remove it")
    return record


def list_all() -> list[JobRecord]:
    """Every record in the index, oldest first. A damaged or foreign `*.json` is reported
    in one warning naming the file and skipped; a named pipe, device or folder is never
    opened (a pipe would block `jobs list` for ever)."""
    folder = os.path.join(mljob_home(), "jobs")
    records = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not name.endswith(".json"):
            continue
        path = os.path.join(folder, name)
        try:
            record = JobRecord.from_json(_read_regular(path))
            if f"{record.job_id}.json" != name:
                raise ValueError(f"it names job {record.job_id!r:.40}")
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("skipping the damaged job record %s (%s); remove it", path,
                        _why(exc))
            continue
        records.append(record)
    return sorted(records, key=lambda r: r.create_time)


MAX_RECORD_BYTES = 64 * 1024 * 1024  # a tuning job's record with 10,000 trials is ~10 MB


def _read_regular(path: str) -> bytes:
    """A regular file's bytes, without blocking on a named pipe (opened non-blocking and
    checked with fstat before any read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("it is not a regular file")
        if info.st_size > MAX_RECORD_BYTES:
            raise ValueError(f"it is larger than {MAX_RECORD_BYTES} bytes")
        return f.read(MAX_RECORD_BYTES + 1)


def _why(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON: {exc.msg} at line {exc.lineno}"
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return " ".join(str(exc).split())[:120] or type(exc).__name__


def used_in_job_dir(job_dir: str, job_id: str) -> bool:
    try:
        return storage.exists(record_url(job_dir, job_id))
    except (storage.StorageError, OSError):
        return False



def own_log_dir(record: JobRecord) -> str:
    """The record's log folder when it is one of the job's own, the folders its runner
    makes (`submit.local.plan.folders`): `$MLJOB_HOME/runs/<job>/logs` (or
    `…/job-dir/logs`), or `<job dir>/logs` of a local job dir that holds this job's
    record. Anything else a hand-edited record names (`/var/log`) is a SubmitError, and
    nothing there is read."""
    if not record.log_dir:
        raise SubmitError(f"job {record.job_id} has no log folder recorded")
    run_dir = os.path.join(mljob_home(), "runs", record.job_id)
    own = [os.path.join(run_dir, "logs"), os.path.join(run_dir, "job-dir", "logs")]
    if record.job_dir and storage.is_local(record.job_dir):
        job_dir = storage.local_path(record.job_dir)
        if os.path.isfile(os.path.join(job_dir, "jobs", f"{record.job_id}.json")):
            own.append(os.path.join(job_dir, "logs"))
    given = os.path.realpath(record.log_dir)
    if any(given == os.path.realpath(folder) for folder in own):
        return given
    raise SubmitError(f"job {record.job_id}'s record names the log folder "
                      f"{record.log_dir[:120]!r}, which is none of the job's own folders; "
                      "nothing there is read (the record was edited: remove it)")
