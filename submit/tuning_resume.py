"""`resumePreviousJobId`, checked when a tuning job is submitted: before its package is
staged or its job id used, the earlier job must be in the local index, be a tuning job
that is not running, and have a study to continue (submit/tuning.py reads it later).
The study's place comes from tuning_spec, not the tuner: the local runner imports this
module, and the tuner imports the local runner."""
from __future__ import annotations

import os

from mljob import storage
from mljob.errors import first_line
from submit import jobs
from submit.errors import SubmitError, UsageError
from submit.package import mljob_home
from submit.tuning_spec import HP_DIR, JOURNAL


def check_resumable(job_id: str) -> None:
    """resumePreviousJobId names a finished tuning job with a study: checked when the job
    is submitted, before its package is staged or its job id used (reads only)."""
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
    local = [os.path.join(storage.local_path(record.job_dir), HP_DIR, JOURNAL)] \
        if record.job_dir and storage.is_local(record.job_dir) else []
    run_dir = os.path.join(mljob_home(), "runs", job_id)
    local += [os.path.join(run_dir, "job-dir", HP_DIR, JOURNAL),
              os.path.join(run_dir, HP_DIR, JOURNAL)]
    if any(os.path.isfile(p) for p in local):
        return
    try:
        if record.job_dir and storage.exists(storage.join(record.job_dir, HP_DIR, JOURNAL)):
            return
    except (storage.StorageError, OSError):
        pass
    raise UsageError(f"resumePreviousJobId {job_id!r} has no study to continue ({JOURNAL} "
                     "is not in its job dir); check the job id")


__all__ = ["check_resumable"]
