"""The life of a job, written once for every runner, on top of the runner's six verbs
(`submit.runners.engine`): `start`, `attach`, `follow`, `refresh`, `cancel` and
`ended`. Nothing here asks which runner it has; what differs between runners is what
they declare (`record_owner`, `supervise_here`) and what their render says
(`Rendered.blocked`, `Rendered.record`).

- `new_record`: the job's record before it starts, from the spec and the render. A
  batch prediction job is one more kind of job: its spec (`PredictionSpec`) has no
  training fields, and its render gives the record's `mode`, `prediction_input` and
  `prediction_output`; everything after is the same for both kinds.
- `start`: create the job and record its handle; the line that says so. A runner whose
  supervisor owns the record gets the record saved first (its supervisor reads it) and
  an attached job of a runner that supervises here is not created: `attach` runs it.
- `attach`: stay with a job just started until it ends: follow it, or run it here.
- `follow`: print the job's logs until it ends, then record and report its state.
  Ctrl-C stops following, not the job (as gcloud does).
- `refresh`: the record as it is now: asked of the engine and written, or read again
  where the runner's supervisor writes it. An ended job is not asked again: an engine
  may have cleaned it away since (a deleted TFJob).
- `cancel`: cancel a job that has not ended.
- `ended`: the exit status of a job that ended (0, or JobFailed / JobCancelled).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from submit import jobs as records
from submit.errors import JobCancelled, JobFailed, UsageError
from submit.packaging.package import Package
from submit.runners.engine import SUPERVISOR, Rendered, Runner
from submit.jobdef.spec import JobSpec
from submit.prediction.spec import PredictionSpec

Echo = Callable[..., None]


def new_record(runner: Runner, spec: JobSpec | PredictionSpec, package: Package | None,
               rendered: Rendered) -> records.JobRecord:
    """The job's record before it starts; replicas are as the runner reports them, and
    so is a batch prediction job's kind (`Rendered.record`)."""
    fields: dict[str, Any] = dict(job_id=spec.job_id, labels=dict(spec.labels))
    if isinstance(spec, JobSpec):
        fields.update(
            job_dir=spec.job_dir, scale_tier=spec.scale_tier,
            package_url=package.url if package else None,
            package_sha256=package.sha256 if package else None,
            module=spec.module_name, trainer_args=list(spec.trainer_args),
            training_input=dict(spec.training_input))
    return records.JobRecord(**{**fields, **rendered.record, "runner": runner.name})


def handle(record: records.JobRecord) -> Mapping[str, Any]:
    """The handle the verbs get: the one `create` returned, with the job's id."""
    return {"job_id": record.job_id, **record.engine}


def start(runner: Runner, rendered: Rendered, record: records.JobRecord, *,
          attach: bool) -> str:
    """Create the job (unless it is to run here, attached), keep its handle in the
    saved record, and return the line that says so."""
    if rendered.blocked:
        raise UsageError(rendered.blocked)
    owned = runner.record_owner == SUPERVISOR
    record.engine = dict(rendered.handle)
    if owned:
        records.save(record)  # the supervisor, in this process or its own, reads it
    if not (attach and runner.supervise_here is not None):
        created = dict(runner.create(rendered))
        record.engine = created
        if owned:
            record.adopt_supervisor(created["supervisor_pid"])
        records.save(record)
    named = rendered.named.format(**record.engine)  # the engine's name for it, if another
    return f"Job [{record.job_id}] submitted successfully to {runner.name}{named}."


def detached_hint(record: records.JobRecord) -> str:
    """How to find a job again that was started with --async."""
    pid = f"Supervisor pid {record.supervisor_pid}. " if record.supervisor_pid else ""
    return (f"{pid}Follow the job with:\n"
            f"  python -m submit jobs stream-logs {record.job_id}\n"
            f"  python -m submit jobs describe {record.job_id}")


def attach(runner: Runner, rendered: Rendered, record: records.JobRecord,
           echo: Echo) -> int:
    """Stay with a job just started until it ends; its exit status."""
    if runner.supervise_here is None:
        return follow(runner, record, echo, task_name=None)
    runner.supervise_here(rendered, record)  # to its end; Ctrl-C cancels it
    return report(record, echo)


def follow(runner: Runner, record: records.JobRecord, echo: Echo, *,
           task_name: str | None, reraise: bool = False) -> int:
    """Print the job's logs until it ends, then record and report its state. Ctrl-C
    stops following (the job goes on): the status JobCancelled's, or (`reraise`, the
    Python API's) the KeyboardInterrupt raised again, the caller's."""
    try:
        for line in runner.logs(handle(record), task_name=task_name, follow=True):
            echo(line)
    except KeyboardInterrupt:
        echo(f"Stopped following; job [{record.job_id}] goes on. Cancel it with "
             f"`python -m submit jobs cancel {record.job_id}`.")
        if reraise:
            raise
        return JobCancelled.exit_status
    return report(refresh(runner, record), echo)


def refresh(runner: Runner, record: records.JobRecord) -> records.JobRecord:
    """The record as it is now (see the module docstring)."""
    if runner.record_owner == SUPERVISOR:
        return records.load(record.job_id)
    if record.done:
        return record
    status = runner.status(handle(record))
    if status.state != record.state:
        record.set_state(status.state, status.message)
    elif status.message:
        record.error_message = status.message
    if status.training_output is not None:
        record.training_output = dict(status.training_output)
    if status.prediction_output is not None:
        record.prediction_output = dict(status.prediction_output)
    if status.replicas:
        record.replicas = [records.ReplicaRecord(r.label, state=r.state,
                                                 exit_code=r.exit_code, restarts=r.restarts)
                           for r in status.replicas]
    records.save(record)
    return record


def cancel(runner: Runner, record: records.JobRecord) -> records.JobRecord:
    """Cancel a job that has not ended; the record as it is afterwards."""
    record = refresh(runner, record)  # the record may be stale: did it end meanwhile?
    if record.done:
        raise UsageError(f"job {record.job_id!r} already ended {record.state}; "
                         "nothing to cancel")
    state = runner.cancel(handle(record))
    if runner.record_owner == SUPERVISOR:  # its supervisor recorded how it ended
        return records.load(record.job_id)
    record.set_state(state)
    records.save(record)
    return record


def report(record: records.JobRecord, echo: Echo) -> int:
    """Say how the job ended; its exit status."""
    echo(f"Job [{record.job_id}] {record.state}.")
    return ended(record, f"; see {record.log_dir}" if record.log_dir else "")


def ended(record: records.JobRecord, hint: str = "") -> int:
    """The exit status of a job that ended: 0, or JobFailed / JobCancelled raised."""
    if record.state == records.FAILED:
        raise JobFailed(f"job {record.job_id} failed: {record.error_message}{hint}")
    if record.state == records.CANCELLED:
        raise JobCancelled(f"job {record.job_id} was cancelled")
    return 0
