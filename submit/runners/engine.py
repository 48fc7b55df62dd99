"""Runners: where a job runs, behind six verbs. The local runner supervises processes
on this machine (`submit.local`); a cluster engine hands the job to Kubernetes
(Kubeflow's TFJob) or Vertex AI. The CLI and the submission use-case never ask which
runner they have: they drive a runner through `submit.lifecycle`, the life of a job
written once on top of these verbs.

The verbs, and nothing else (a new runner implements these; see docs/architecture.md):

- `check(spec)`: refuse what the runner cannot run (more replicas than it takes, a job
  dir its replicas cannot reach), before anything is built or staged. Raises UsageError.
- `render(spec, package)`: the runner's own job object (`Rendered`): the local plan, or
  the engine's job built through the engine SDK's types so that a wrong field fails
  here. No network. `--dry-run` prints its `text`. A batch prediction job
  (`submit.prediction.spec.PredictionSpec`) is rendered by `render_prediction(spec)`,
  which checks it too; a runner that does not take one keeps the default, a one-line
  refusal naming the runners that do (`submit.runners.PREDICTION`). Its `Rendered` is
  created, followed, refreshed and cancelled by the same verbs as a training job's.
- `create(rendered)`: start the job; returns its handle (names, namespace, region, or
  the local supervisor's pid), JSON-able, which the job record keeps so that later
  commands in any process can find the job again.
- `status(handle)`: the job's state as an `EngineStatus` (`jobs describe`).
- `logs(handle, task_name=, follow=)`: log lines, each labelled with its replica; with
  follow, until the job ends (`jobs stream-logs`). An unknown task name is UsageError.
- `cancel(handle)`: stop the job and every replica; the state to record (CANCELLING or
  CANCELLED).

Every handle the lifecycle passes carries the record's `job_id`.

What differs between runners is declared, as class attributes the lifecycle reads:
`name`; `max_replicas_per_type`; `record_owner` (ENGINE: the lifecycle writes the job
record from `status`; SUPERVISOR: the process the runner's `create` starts writes it, and
`create`'s handle names that process as `supervisor_pid`); `supervise_here` (None: an
attached job is followed through `logs` until it ends, Ctrl-C stops following; a
function of (rendered, record): an attached job is run to its end in this process by
it, and Ctrl-C cancels it); `preflight` (None, or a function of the rendered job that
asks the engine whether it can take the job, raising UsageError when it cannot: called
before anything is staged, never for a dry run; Ray's placement check). What a render
says beside the job object is data in `Rendered` too: `notes` for the user (Kubeflow's
image build context), `blocked` when the job cannot be created as rendered though a dry
run may print it (Kubeflow without --image), `record`, fields of the job record only
the runner knows (a batch prediction job's `mode`, `prediction_input` and
`prediction_output`), and `named`, how the engine names the created job in the line
that says it was created (formatted with the created handle).

Engine SDKs are heavy; each engine module imports its SDK at the top and the registry in
`submit.runners` imports the module only when that runner is asked for, with an install
hint when the SDK is missing.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar
from collections.abc import Iterator, Mapping

from submit import jobs as records
from submit.errors import UsageError
from submit.packaging.package import Package
from submit.jobdef.spec import JobSpec, check_text
from submit.prediction.spec import MODE as PREDICTION_MODE, PredictionSpec


@dataclasses.dataclass(frozen=True)
class RunOpt:
    """One option a runner declares (as torchx's schedulers declare `runopts`): `name`
    the keyword (`EngineOptions.<name>`, the Python API's keyword), `help` as `--help`
    shows it, `flag` the command line's (default `--name-with-dashes`), `choices` when
    only some values are taken, `metavar` for `--help`. A runner lists its options in a
    module of its own that imports no SDK (`RUNOPTS`), named in the registry
    (`submit.runners.OPTIONS`); the CLI builds its click options from them. Two runners
    may declare one name (`--image`): one flag, both helps. `prediction` is its help for
    a batch prediction job when the runner's batch prediction job takes it too (None:
    that job takes no such option; `jobs submit prediction` has no such flag)."""

    name: str
    help: str
    flag: str | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    prediction: str | None = None

    @property
    def option(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


# Options every runner takes (gcloud's own flags, kept in the job's trainingInput too)
SHARED = ("region",)


class EngineOptions:
    """The runner options given, by name (None when not given): `EngineOptions(
    image=..., namespace=...)`, read as attributes (`options.image`). Which runner takes
    which is each runner's declaration (`RunOpt`), not this class."""

    _given: dict[str, str]

    def __init__(self, **given: str | None) -> None:
        object.__setattr__(self, "_given", {k: v for k, v in given.items() if v is not None})

    def __getattr__(self, name: str) -> str | None:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._given.get(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("EngineOptions are read-only")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EngineOptions) and self._given == other._given

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._given.items())))

    def __repr__(self) -> str:
        return f"EngineOptions({', '.join(f'{k}={v!r}' for k, v in self._given.items())})"

    def given(self) -> dict[str, str]:
        return dict(self._given)

    def check_for(self, runner: str, *, prediction: bool = False) -> None:
        """An option no runner declares, or one given to a runner that has no use for
        it, is a mistake, and so are control characters in any of them; `prediction`:
        the options of a batch prediction job."""
        from submit import runners
        declared = runners.declared_options(prediction=prediction)
        for name, value in self._given.items():
            if name in SHARED:
                check_text(value, "--" + name.replace("_", "-"))
                continue
            if name not in declared:
                job = "batch prediction job" if prediction else "runner"
                raise UsageError(f"no {job} takes the option {name!r}; use one of "
                                 f"{', '.join(sorted(declared))}")
            opt, owners, _ = declared[name]
            check_text(value, opt.option)
            if runner not in owners:
                raise UsageError(f"{opt.option} is for --runner {' or '.join(owners)}, not "
                                 f"--runner {runner}; drop it or change --runner")


@dataclasses.dataclass(frozen=True)
class Rendered:
    """A runner's job object: `body` as the engine's API takes it (JSON-able), `text`
    as `--dry-run` prints it, and the `handle` the job will be known by once created;
    `notes` for the user (stderr), `blocked` saying why it cannot be created as it is
    (None when it can), `record` the job record's fields the runner fills, `named` the
    engine's name for the created job in the line that says so (`str.format`ted with
    the created handle: " ({name})"), empty when the job id is its name."""

    body: Mapping[str, Any]
    text: str
    handle: Mapping[str, Any]
    notes: tuple[str, ...] = ()
    blocked: str | None = None
    record: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    named: str = ""

    @property
    def prediction(self) -> bool:
        """Whether this is a batch prediction job (its record's mode says so)."""
        return self.record.get("mode") == PREDICTION_MODE


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


ENGINE, SUPERVISOR = "engine", "supervisor"  # who writes a job's record while it runs


class Runner(abc.ABC):
    """One runner: the six verbs and the declared data of the module docstring."""

    name: ClassVar[str]
    # Replicas per type this runner takes; None leaves the limit to the engine's own API.
    max_replicas_per_type: ClassVar[int | None] = None
    record_owner: ClassVar[str] = ENGINE
    supervise_here: ClassVar[staticmethod[[Rendered, records.JobRecord], Any] | None] = None
    preflight: ClassVar[staticmethod[[Rendered], None] | None] = None

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
    def render(self, spec: JobSpec, package: Package | None) -> Rendered:
        """The runner's job object for a package staged at `package.url`."""

    def render_prediction(self, spec: PredictionSpec) -> Rendered:
        """A batch prediction job's object, checked (UsageError for one this runner
        cannot run); by default the runner takes none."""
        from submit import runners
        raise UsageError(f"--runner {self.name} does not run batch prediction jobs; use "
                         f"--runner {' or '.join(runners.PREDICTION)}")

    @abc.abstractmethod
    def create(self, rendered: Rendered) -> Mapping[str, Any]:
        """Start the job; return its handle (JSON-able), kept in the job record."""

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
        """Not part of a job's life: `jobs update` changes the job's labels on the
        engine where it keeps them (a TFJob's); the caller keeps them in the record.
        Returns a note for the user, or None. By default the labels are the record's
        alone."""
        return None


ClusterEngine = Runner  # the engines' name for the same interface
