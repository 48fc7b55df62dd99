"""`resumePreviousJobId`: the earlier tuning job whose study a new one continues.

`check_resumable` runs when the job is submitted, before its package is staged or its
job id used (reads only): the earlier job must be in the local index, be a tuning job
that is not running, and have a study to continue. `journal_of` finds that study when
the tuner starts, fetching it when it lives only in a gs:// job dir.
"""
from __future__ import annotations

import os

from mljob import storage
from mljob.errors import first_line
from submit import jobs
from submit.errors import SubmitError, UsageError
from submit.home import mljob_home
from submit.jobdef.tuning_spec import HP_DIR, JOURNAL


def check_resumable(job_id: str) -> None:
    """resumePreviousJobId names a finished tuning job with a study."""
    try:
        record = jobs.load(job_id)
    except SubmitError as exc:  # missing, or a damaged record
        raise UsageError(f"resumePreviousJobId: {first_line(exc)}") from None
    if "hyperparameters" not in (record.training_input or {}):
        raise UsageError(f"resumePreviousJobId {job_id!r} is not a hyperparameter tuning "
                         "job (its trainingInput has no hyperparameters); name a tuning job")
    if record.running():
        raise UsageError(f"resumePreviousJobId {job_id!r} is still {record.state}; wait "
                         f"for it to end or cancel it (python -m submit jobs cancel {job_id})")
    if any(os.path.isfile(p) for p in _local_journals(record)):
        return
    try:
        if record.job_dir and storage.exists(storage.join(record.job_dir, HP_DIR, JOURNAL)):
            return
    except (storage.StorageError, OSError):
        pass
    raise _no_study(job_id)


def journal_of(record: jobs.JobRecord) -> str:
    """The local path of an earlier job's study, fetched when it lives only in its
    gs:// job dir."""
    for path in _local_journals(record):
        if os.path.exists(path):
            return path
    if record.job_dir:
        url = storage.join(record.job_dir, HP_DIR, JOURNAL)
        try:
            data = storage.read_bytes(url)
        except (FileNotFoundError, storage.StorageError, OSError):
            data = None
        if data is not None:
            path = os.path.join(mljob_home(), "runs", record.job_id, "fetched-" + JOURNAL)
            storage.write_bytes(path, data)
            return path
    raise _no_study(record.job_id)


def _local_journals(record: jobs.JobRecord) -> list[str]:
    """Where the tuner leaves a study on this machine: the job dir when it is a path,
    else the run folder (memory:// and gs:// job dirs)."""
    local = [os.path.join(storage.local_path(record.job_dir), HP_DIR, JOURNAL)] \
        if record.job_dir and storage.is_local(record.job_dir) else []
    run_dir = os.path.join(mljob_home(), "runs", record.job_id)
    return local + [os.path.join(run_dir, "job-dir", HP_DIR, JOURNAL),
                    os.path.join(run_dir, HP_DIR, JOURNAL)]


def _no_study(job_id: str) -> UsageError:
    return UsageError(f"resumePreviousJobId {job_id!r} has no study to continue ({JOURNAL} "
                      "is not in its job dir); check the job id")


__all__ = ["check_resumable", "journal_of"]
