"""Cluster engines: the same job handed to Kubernetes (Kubeflow's TFJob) or Vertex AI.

The local runner supervises processes itself; an engine hands the job to a cluster that
does, so its boundary is different and small:

- `check(spec)`: refuse what the engine cannot run (a job dir its replicas cannot reach),
  before anything is built or staged.
- `render(spec, package)`: the engine's own job object, built through the engine SDK's
  types so that a wrong field fails here. Pure: no network. `--dry-run` prints its text.
- `create(rendered)`: submit it with the engine's official client; returns the handle
  (names, namespace, region...) that the job record keeps, so that later commands in
  any process can find the job again.
- `status(handle)`, `logs(handle, ...)`, `cancel(handle)`: what `jobs describe`,
  `jobs stream-logs` and `jobs cancel` do for a job that runs on the engine.

Engine SDKs are heavy; each engine module imports its SDK at the top and the registry in
`submit.runners` imports the module only when that runner is asked for, with an install
hint when the SDK is missing.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar, Iterator, Mapping

from submit.errors import UsageError
from submit.package import Package
from submit.spec import JobSpec


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """The engine flags of `python -m submit` (None when not given).

    `image`: Kubeflow's container image (the trainer installed, see the generated
    Dockerfile), or Vertex's `executor_image_uri` (a Python image the staged sdist is
    pip-installed into). `namespace` and `context` pick the Kubernetes namespace and
    kubeconfig context; `project` and `region` the Vertex location.
    `service_account` is a Kubernetes service account or a Google service account email.
    """

    image: str | None = None
    namespace: str | None = None
    context: str | None = None
    project: str | None = None
    region: str | None = None
    service_account: str | None = None

    # which runner each option belongs to (the rest are shared)
    OWNERS: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "image": ("kubeflow", "vertex"), "namespace": ("kubeflow",),
        "context": ("kubeflow",), "project": ("vertex",), "region": ("vertex",),
        "service_account": ("kubeflow", "vertex")}

    def check_for(self, runner: str) -> None:
        """Engine flags given to a runner that has no use for them are mistakes."""
        for name, owners in self.OWNERS.items():
            if getattr(self, name) is not None and runner not in owners:
                flag = "--kube-context" if name == "context" else "--" + name.replace("_", "-")
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


class ClusterEngine(abc.ABC):
    """One cluster engine; see the module docstring for the life of a job."""

    name: ClassVar[str]

    def __init__(self, options: EngineOptions):
        options.check_for(self.name)
        self.options = options

    @abc.abstractmethod
    def check(self, spec: JobSpec) -> None:
        """Raise UsageError for a job this engine cannot run."""

    @abc.abstractmethod
    def render(self, spec: JobSpec, package: Package) -> Rendered:
        """The engine's job object for a package staged at `package.url`."""

    def prepare(self, spec: JobSpec, package: Package) -> list[str]:
        """Write what the user needs on this machine before the job can run (Kubeflow:
        the image's build context); return lines telling them what to do with it."""
        return []

    def ready(self, rendered: Rendered) -> None:
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
