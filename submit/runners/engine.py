"""Runners: where a job runs, behind one interface. The local runner supervises processes
on this machine; a cluster engine hands the job to Kubernetes (Kubeflow's TFJob) or
Vertex AI. The CLI and the submission use-case never ask which runner they have.

- `check(spec)`: refuse what the runner cannot run (more replicas than it takes, a job
  dir its replicas cannot reach), before anything is built or staged.
- `render(spec, package)`: the runner's own job object: the local plan, or the engine's
  job built through the engine SDK's types so that a wrong field fails here. Pure: no
  network. `--dry-run` prints its text.
- `create(rendered)`: start the job; returns the handle (names, namespace, region, or the
  local supervisor's pid) that the job record keeps, so that later commands in any
  process can find the job again.
- `status(handle)`, `logs(handle, ...)`, `cancel(handle)`: what `jobs describe`,
  `jobs stream-logs` and `jobs cancel` ask.

On top of these, the life of a job (`start`, `attach`, `follow`, `refresh`,
`cancel_job`) is written once here; the local runner overrides what it does in-process
(it supervises an attached job in the foreground, and its supervisor owns the record).

Engine SDKs are heavy; each engine module imports its SDK at the top and the registry in
`submit.runners` imports the module only when that runner is asked for, with an install
hint when the SDK is missing.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar
from collections.abc import Callable, Iterator, Mapping

from submit import jobs as records
from submit.errors import JobCancelled, JobFailed, UsageError
from submit.package import Package
from submit.spec import JobSpec, check_text


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """The engine flags of `python -m submit` (None when not given).

    `image`: Kubeflow's container image (the trainer installed, see the generated
    Dockerfile), or Vertex's `executor_image_uri` (a Python image the staged sdist is
    pip-installed into). `namespace` and `context` pick the Kubernetes namespace and
    kubeconfig context; `project` and `region` the Vertex location (every runner accepts
    `region`, and records it in trainingInput).
    `service_account` is a Kubernetes service account or a Google service account email.
    """

    image: str | None = None
    namespace: str | None = None
    context: str | None = None
    project: str | None = None
    region: str | None = None
    service_account: str | None = None
    ray_address: str | None = None  # ray: the dashboard's address (else $RAY_ADDRESS)

    # which runner each option belongs to (the rest are shared)
    OWNERS: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "image": ("kubeflow", "vertex"), "namespace": ("kubeflow",),
        "context": ("kubeflow",), "project": ("vertex",),
        "service_account": ("kubeflow", "vertex"), "ray_address": ("ray",)}

    def check_for(self, runner: str) -> None:
        """Engine flags given to a runner that has no use for them are mistakes, and so
        are control characters in any of them."""
        for name, owners in self.OWNERS.items():
            flag = "--kube-context" if name == "context" else "--" + name.replace("_", "-")
            if getattr(self, name) is not None:
                check_text(getattr(self, name), flag)
            if getattr(self, name) is not None and runner not in owners:
                raise UsageError(f"{flag} is for --runner {' or '.join(owners)}, not "
                                 f"--runner {runner}; drop it or change --runner")


@dataclasses.dataclass(frozen=True)
class Rendered:
    """An engine's job object: `body` as the engine's API takes it (JSON-able), `text`
    as `--dry-run` prints it, and the `handle` the job will be known by once created."""

    body: Mapping[str, Any]
    text: str
    handle: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class ReplicaStatus:
    """One replica as the engine reports it, labelled as Cloud ML labels replicas."""

    label: str
    state: str                 # PENDING, RUNNING, EXITED, FAILED, ...
    exit_code: int | None = None
    restarts: int = 0


@dataclasses.dataclass(frozen=True)
class EngineStatus:
    """The job's state mapped onto the job record's states (QUEUED ... CANCELLED)."""

    state: str
    message: str | None = None
    replicas: tuple[ReplicaStatus, ...] = ()
    training_output: Mapping[str, Any] | None = None  # a tuning job's trials (Cloud ML's)
    prediction_output: Mapping[str, Any] | None = None  # a batch prediction job's


class Runner(abc.ABC):
    """One runner; see the module docstring for the life of a job."""

    name: ClassVar[str]
    # Replicas per type this runner takes; None leaves the limit to the engine's own API.
    max_replicas_per_type: ClassVar[int | None] = None

    def __init__(self, options: EngineOptions):
        options.check_for(self.name)
        self.options = options

    def check(self, spec: JobSpec) -> None:
        """Raise UsageError for a job this runner cannot run."""
        limit = self.max_replicas_per_type
        for group in spec.groups:
            if limit is not None and group.count > limit:
                raise UsageError(
                    f"{group.count} {group.task_type} replicas are more than the "
                    f"{self.name} runner's limit of {limit} per type; use fewer, or "
                    "--runner kubeflow or vertex for a larger cluster")

    @abc.abstractmethod
    def render(self, spec: JobSpec, package: Package) -> Rendered:
        """The engine's job object for a package staged at `package.url`."""

    def prepare(self, spec: JobSpec, package: Package) -> list[str]:
        """Write what the user needs on this machine before the job can run (Kubeflow:
        the image's build context); return lines telling them what to do with it."""
        return []

    def ready(self, rendered: Rendered) -> None:  # noqa: B027 - a hook, empty by default
        """Raise UsageError when the job cannot be submitted as rendered (a dry run may
        still print it: Kubeflow's needs --image only to run). Called before staging."""

    @abc.abstractmethod
    def create(self, rendered: Rendered) -> Mapping[str, Any]:
        """Submit the job; return its handle (JSON-able), kept in the job record."""

    @abc.abstractmethod
    def status(self, handle: Mapping[str, Any]) -> EngineStatus:
        """The job's current state."""

    @abc.abstractmethod
    def logs(self, handle: Mapping[str, Any], *, task_name: str | None = None,
             follow: bool = True) -> Iterator[str]:
        """Log lines, each prefixed with its replica's label; with follow, until the
        job ends."""

    @abc.abstractmethod
    def cancel(self, handle: Mapping[str, Any]) -> str:
        """Stop the job and every replica; return the state to record (CANCELLING or
        CANCELLED)."""

    def update_labels(self, record: records.JobRecord, old: Mapping[str, str],
                      new: Mapping[str, str]) -> str | None:
        """Change the job's labels on the engine (`jobs update`); the caller keeps them in
        the record. Returns a note for the user, or None. The local runner's labels are
        its record's alone."""
        return None

    # The life of a job, written once for every runner.

    def new_record(self, spec: JobSpec, package: Package | None,
                   rendered: Rendered) -> records.JobRecord:
        """The job's record before it starts; replicas are as the engine reports them."""
        return records.JobRecord(
            job_id=spec.job_id, job_dir=spec.job_dir, scale_tier=spec.scale_tier,
            package_url=package.url if package else None,
            package_sha256=package.sha256 if package else None,
            module=spec.module_name, trainer_args=list(spec.trainer_args),
            training_input=dict(spec.training_input), runner=self.name,
            labels=dict(spec.labels))

    def start(self, rendered: Rendered, record: records.JobRecord, *,
              attach: bool) -> str:
        """Create the job, keep its handle in the saved record, and return the line that
        says so."""
        record.engine = dict(self.create(rendered))
        records.save(record)
        return f"Job [{record.job_id}] submitted successfully to {self.name}."

    def detached_hint(self, record: records.JobRecord) -> str:
        return (f"Follow the job with:\n"
                f"  python -m submit jobs stream-logs {record.job_id}\n"
                f"  python -m submit jobs describe {record.job_id}")

    def attach(self, rendered: Rendered, record: records.JobRecord,
               echo: Callable[[str], None]) -> int:
        """Stay with a job just started until it ends; its exit status."""
        return self.follow(record, echo, task_name=None)

    def follow(self, record: records.JobRecord, echo: Callable[[str], None], *,
               task_name: str | None) -> int:
        """Print the job's logs until it ends, then record and report its state. Ctrl-C
        stops following, not the job (as gcloud does)."""
        try:
            for line in self.logs(record.engine, task_name=task_name, follow=True):
                echo(line)
        except KeyboardInterrupt:
            echo(f"Stopped following; job [{record.job_id}] goes on. Cancel it with "
                 f"`python -m submit jobs cancel {record.job_id}`.")
            return JobCancelled.exit_status
        record = self.refresh(record)
        echo(f"Job [{record.job_id}] {record.state}.")
        return ended(record)

    def refresh(self, record: records.JobRecord) -> records.JobRecord:
        """Ask the engine for the job's state and keep it in the record. A job that ended
        is not asked again: an engine may have cleaned it away since (a deleted TFJob)."""
        if record.done:
            return record
        status = self.status(record.engine)
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
                                                     exit_code=r.exit_code,
                                                     restarts=r.restarts)
                               for r in status.replicas]
        records.save(record)
        return record

    def cancel_job(self, record: records.JobRecord) -> records.JobRecord:
        """Cancel a job that has not ended; the record as it is afterwards."""
        record = self.refresh(record)  # the record may be stale: did it end meanwhile?
        if record.done:
            raise UsageError(f"job {record.job_id!r} already ended {record.state}; "
                             "nothing to cancel")
        record.set_state(self.cancel(record.engine))
        records.save(record)
        return record


ClusterEngine = Runner  # the engines' name for the same interface


def ended(record: records.JobRecord, hint: str = "") -> int:
    """The exit status of a job that ended: 0, or JobFailed / JobCancelled raised."""
    if record.state == records.FAILED:
        raise JobFailed(f"job {record.job_id} failed: {record.error_message}{hint}")
    if record.state == records.CANCELLED:
        raise JobCancelled(f"job {record.job_id} was cancelled")
    return 0
