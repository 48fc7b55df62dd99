"""mljob's Python API: jobs, batch prediction jobs, models and versions from a notebook
or a pipeline, with the command line's behaviour (it is the same code underneath).

    from submit import api

    job = api.submit("job01", package_path="trainer", module_name="trainer.task",
                     job_dir="jobs/job01", scale_tier="BASIC", args=["--train-steps", "100"])
    job.wait()                      # to its end; JobFailed / JobCancelled if it did not succeed
    job.state                       # "SUCCEEDED": read again at every access
    for line in job.logs():         # follow=True: until the job ends
        print(line)
    job.describe()["trainingOutput"]   # Cloud ML's Job resource, numbers as numbers
    job.metrics()                   # every scalar of its summaries: run, tag, step, value
    api.list_jobs(filter="state=RUNNING OR labels.team=vision")
    with api.get_model("fashion").deploy() as endpoint:   # its default version, served
        endpoint.predict([{"image": [0.0] * 784}]).predictions

Every job is started detached (the CLI's `--async`): `submit` returns once the job is
recorded and its supervisor runs, so a notebook is never tied to it; `wait`, `logs`,
`cancel` and `describe` work from any process, later. Errors are exceptions:
`UsageError` (a mistake in what was asked: the CLI's exit 2, the same one-line
message), `JobNotFoundError`, `JobFailed`, `JobCancelled`, `JobTimeout`, all
`SubmitError`s.

Every argument of every public call is checked against its annotation before anything
is read, written or started (`submit/api/checks.py`): a wrong type is `WrongType`, a value
no call takes (nan, negative, huge, NUL, a config that contains itself) `BadValue`, both
`UsageError`s in one line (`args="--lr 0.1"` is refused with the list it meant). An
interrupt (Ctrl-C, a notebook's stop button) is the caller's: `follow` and `wait` let
KeyboardInterrupt through, the job goes on. `submit` and `wait` show their progress
(`submit/api/progress.py`: a bar in a notebook with ipywidgets, lines on stderr elsewhere;
`progress=False` or MLJOB_PROGRESS=0 turns it off). `describe()` gives counts,
`trainingStep` and numeric trial parameters as numbers (`jobs describe` prints Cloud
ML's REST form, where they are strings).

The job commands of the CLI (`jobs submit training`, `list`, `describe`, `stream-logs`,
`cancel`, `wait`; submit/cli/cmd_jobs.py, cmd_submit.py) are a few lines each over this
module: they print what it returns, and its exceptions' messages are their one-line
errors, so the two cannot drift apart.

The API lives in `submit` (the launcher), not in `mljob`: `mljob` is the core that job
images install alone, and it imports nothing of the launcher.
"""
from __future__ import annotations

import dataclasses
import os
import time
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from submit import resource, runners
from submit import jobs as records
from submit import lifecycle, submission
from submit.api import checks as api_checks
from submit.api import progress as api_progress
from submit.api.checks import BadValue, WrongType
from submit.api.model import Model, create_model, get_model, list_models
from submit.api.endpoint import Endpoint, Prediction
from submit.jobdef import spec as specs
from submit.query import curves, listing
from submit.errors import (JobCancelled, JobFailed, JobNotFoundError, SubmitError,
                           UsageError)
from submit.runners.engine import SHARED, EngineOptions

__all__ = ["Job", "Model", "Endpoint", "Prediction", "submit", "submit_prediction",
           "get_job", "list_jobs", "create_model", "get_model", "list_models",
           "SubmitError", "UsageError", "WrongType", "BadValue", "JobFailed",
           "JobCancelled", "JobNotFoundError", "JobTimeout"]
POLL_S = 0.5


class JobTimeout(SubmitError, TimeoutError):
    """`wait(timeout=...)` passed its time; the job goes on."""


def job_resource(record: records.JobRecord) -> dict[str, Any]:
    """Cloud ML's Job resource of a record: what `Job.describe()` returns and `jobs
    describe` / `jobs list --format` print."""
    return resource.job(record)


class Job:
    """A submitted job (training, tuning or batch prediction), by its id."""

    def __init__(self, job_id: str, *, notes: Sequence[str] = ()):
        records.load(job_id)  # JobNotFoundError (a UsageError) when there is none
        self.job_id = job_id
        self.notes = list(notes)  # what the submission said (stderr's lines in the CLI)

    def __repr__(self) -> str:
        return f"Job({self.job_id!r}, state={self.state!r})"

    def record(self, *, refresh: bool = True) -> records.JobRecord:
        """The job's record (mljob's own form: replicas, PIDs, log paths), as its runner
        reports it now (`refresh=False`: as the index holds it)."""
        record = records.load(self.job_id)
        if not refresh:
            return record
        return lifecycle.refresh(submission.runner_for(record), record)

    _record = record

    @property
    def state(self) -> str:
        """QUEUED, PREPARING, RUNNING, SUCCEEDED, FAILED, CANCELLING or CANCELLED, as
        it is now."""
        return self._record().state

    @property
    def done(self) -> bool:
        return self._record().done

    def describe(self) -> dict[str, Any]:
        """Cloud ML's Job resource, as `jobs describe --format json` prints it, with
        its counts, `trainingStep` and numeric trial parameters as numbers."""
        return resource.with_numbers(job_resource(self.record()))

    def wait(self, timeout: float | None = None, *, progress: bool | None = None) -> Job:
        """Block until the job ends; itself when it SUCCEEDED. JobFailed (with the
        job's error message) or JobCancelled otherwise; JobTimeout (a TimeoutError)
        past `timeout` seconds (the job goes on); SubmitError at once when the job's
        supervisor died without ending it. `progress`: its state and latest step as
        it goes (see the module docstring)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        shown = api_progress.Progress(self.job_id, on=api_progress.enabled(progress))
        steps = api_progress.JobSteps(self._record(refresh=False))
        try:
            while True:
                record = self._record()
                if record.done:
                    shown.job(record.state, *steps.now(force=True))
                    lifecycle.ended(record, f"; see {record.log_dir}" if record.log_dir
                                    else "")
                    return self
                if record.runner == "local" and not record.running():
                    raise SubmitError(f"job {self.job_id}'s supervisor is gone and the job "
                                      f"never ended; cancel it with Job.cancel()")
                if deadline is not None and time.monotonic() > deadline:
                    raise JobTimeout(f"job {self.job_id} is still {record.state} after "
                                     f"{timeout:g} s; wait again, or cancel it")
                shown.job(record.state, *steps.now())
                time.sleep(POLL_S)
        finally:
            shown.close()

    def metrics(self) -> list[dict[str, Any]]:
        """Every scalar the job wrote to its summaries (`<job-dir>/summaries/train`,
        `eval`, ...), one row each, `{"run", "tag", "step", "value"}`, sorted by run,
        tag and step: `pandas.DataFrame(job.metrics())` is TensorBoard's
        `get_scalars()` frame. Read with TensorBoard's reader without loading
        TensorFlow; [] before the first summary is written."""
        record = self._record(refresh=False)
        try:
            series = curves.JobCurves(record.job_dir).read() if record.job_dir else {}
        except curves.MissingReader as exc:
            raise UsageError(str(exc)) from None
        rows = [{"run": run, "tag": tag, "step": step, "value": value}
                for tag, runs in series.items() for run, points in runs.items()
                for step, value in points.items()]
        return sorted(rows, key=lambda row: (row["run"], row["tag"], row["step"]))

    def logs(self, *, follow: bool = False, task_name: str | None = None) -> Iterator[str]:
        """The job's log lines (`task_name`: one replica's, e.g. master-replica-0);
        with `follow`, new lines as they are written until the job ends."""
        record = records.load(self.job_id)
        runner = submission.runner_for(record)
        yield from runner.logs(lifecycle.handle(record), task_name=task_name,
                               follow=follow)

    def follow(self, echo: Callable[..., None] = print, *,
               task_name: str | None = None) -> int:
        """Print (`echo`) the job's log lines as they come until it ends, then how it
        ended; 0 when it SUCCEEDED, else JobFailed / JobCancelled. An interrupt
        (Ctrl-C, a notebook's stop) stops following, says the job goes on, and is
        raised again: KeyboardInterrupt is the caller's (the rest of a cell does not
        run on)."""
        record = records.load(self.job_id)
        return lifecycle.follow(submission.runner_for(record), record, echo,
                                task_name=task_name, reraise=True)

    def cancel(self) -> Job:
        """Stop every replica (or worker); the job ends CANCELLED. UsageError when it
        has already ended."""
        record = records.load(self.job_id)
        lifecycle.cancel(submission.runner_for(record), record)
        return self


def _noted(job_id: str, progress: bool | None):
    """A submission's echo: each note kept for the Job and shown as progress."""
    notes: list[str] = []
    shown = api_progress.Progress(job_id, on=api_progress.enabled(progress))

    def echo(text: str, err: bool = False) -> None:
        notes.append(text)
        shown.note(text)
    return notes, shown, echo

def submit(job_id: str, *, package_path: str | None = None,
           module_name: str | None = None, job_dir: str | None = None,
           args: Sequence[str] | None = None, scale_tier: str | None = None,
           config: str | Mapping[str, Any] | None = None,
           labels: Mapping[str, str] | Sequence[str] | None = None, runner: str = "local",
           resume: bool = False, progress: bool | None = None, **options: Any) -> Job:
    """Submit a training (or, with `trainingInput.hyperparameters` in `config`, a
    tuning) job, as `python -m submit jobs submit training JOB_ID --async`; the Job.

    `args` are the trainer's arguments, a list (`["--lr", "0.1"]`). `config` is a
    config.yaml path or the same document as a dict (Cloud ML's Job: `{"trainingInput":
    {...}, "labels": {...}}`). Every other keyword is the flag of the same name
    (`worker_count=2`, `region="us-central1"`, `image=...` for kubeflow, `project=...`
    for vertex, `ray_address=...`). `progress`: each step of the submission (packaging,
    an image built, the job started) shown as it happens."""
    notes, shown, echo = _noted(job_id, progress)
    try:
        run_submission(job_id, package_path=package_path, module_name=module_name,
                       job_dir=job_dir, args=args, scale_tier=scale_tier, config=config,
                       labels=labels, runner=runner, resume=resume, echo=echo, **options)
    finally:
        shown.close()
    return Job(job_id, notes=notes)


def run_submission(job_id: str, *, echo: Callable[..., None], stream: bool = False,
                   dry_run: bool = False, args: Sequence[str] | None = None,
                   config: str | Mapping[str, Any] | None = None,
                   labels: Mapping[str, str] | Sequence[str] | None = None,
                   packages: str | Sequence[str] | None = None, runner: str = "local",
                   resume: bool = False, **options: Any) -> int:
    """`submit`'s work, and the command line's: the job the flags describe submitted
    (`stream`: followed to its end; `dry_run`: its plan printed, nothing run), what it
    says given to `echo(text, err=False)`; the exit status (0, or the job's end raised
    as JobFailed / JobCancelled)."""
    engine = {k: options.pop(k) for k in list(options)
              if k in runners.declared_options() or k in SHARED}
    if "region" in engine:  # every runner records it in trainingInput; vertex runs there
        options["region"] = engine["region"]
    engine_options = EngineOptions(**engine)
    engine_options.check_for(runner)
    if engine_options.build_image is not None or engine_options.base_image is not None:
        from submit.runners import local_image  # the image tools load only when asked for
        options["package_path"], options["module_name"] = local_image.build_for_submit(
            engine_options, options.get("package_path"), options.get("module_name"),
            dry_run, options, log=lambda text: echo(text, err=True))
    if isinstance(packages, str):
        packages = (packages,)
    given: tuple[str, ...] | dict[str, str] | None = None
    if isinstance(labels, Mapping):
        given = dict(labels) or None
    elif labels:
        given = tuple(labels)  # --labels' KEY=VALUE,... words
    flags = specs.Flags(job_id, args=None if args is None else tuple(args), labels=given,
                        packages=tuple(p for given in packages for p in given.split(",") if p)
                        if packages else None, **_flag_fields(options))
    with _config_file(config) as path:
        return submission.submit(submission.Submission(
            flags, runner=runner, options=engine_options, config_path=path,
            dry_run=dry_run, stream=stream, resume=resume), echo)


def _flag_fields(options: dict[str, Any]) -> dict[str, Any]:
    known = {f.name for f in dataclasses.fields(specs.Flags)} - {"job_id", "staged"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(f"submit() got unknown option {unknown[0]!r}; use the flags' "
                         "names (worker_count, region, runtime_version, ...)")
    return options


class _config_file:
    """A config given as a dict, written to a temporary YAML file for the reader that
    checks every config (anchors, sizes, the schema)."""

    def __init__(self, config: str | Mapping[str, Any] | None):
        self.config = config
        self.path: str | None = None

    def __enter__(self) -> str | None:
        if self.config is None or isinstance(self.config, str):
            return self.config
        import tempfile

        import yaml
        api_checks.check_data(self.config, "submit(config=...)")
        try:  # written out whole before any file is made: nothing is left half-written
            text = yaml.safe_dump(_plain(self.config))
        except (yaml.YAMLError, ValueError, TypeError, RecursionError) as exc:
            raise BadValue(f"submit(config=...) cannot be written as YAML "
                           f"({type(exc).__name__}); give strings, numbers, booleans, "
                           "lists and dicts") from None
        fd, self.path = tempfile.mkstemp(prefix="mljob-config-", suffix=".yaml")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
        except BaseException:
            os.unlink(self.path)
            raise
        return self.path

    def __exit__(self, *exc: object) -> None:
        if self.path:
            os.unlink(self.path)


def _plain(value: Any) -> Any:
    """A config's mappings and tuples as the dicts and lists YAML's safe writer takes
    (checked first by `api_checks.check_data`: no cycle, bounded depth)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def submit_prediction(job_id: str, *, model_dir: str | None = None,
                      model: str | None = None, version: str | None = None,
                      input_paths: str | Sequence[str], output_path: str,
                      data_format: str = "text", region: str = "us-central1",
                      max_worker_count: int | None = None, batch_size: int | None = None,
                      signature_name: str | None = None,
                      labels: Mapping[str, str] | None = None,
                      resume: bool = False, runner: str = "local",
                      progress: bool | None = None, **options: str) -> Job:
    """Submit a batch prediction job, as `python -m submit jobs submit prediction JOB_ID
    --async`; the Job. `input_paths`: globs (a list, or comma-separated). `runner`:
    local (this machine), vertex or kubeflow, with that runner's options by name
    (`project=...`, `image=...`, `namespace=...`). `progress`: as `submit`'s."""
    from submit.prediction import spec as prediction_spec
    paths = input_paths if isinstance(input_paths, str) else ",".join(input_paths)
    spec = prediction_spec.resolve(
        job_id, model_dir=model_dir, model=model, version=version, input_paths=paths,
        output_path=output_path, data_format=data_format, region=region,
        max_worker_count=max_worker_count, batch_size=batch_size,
        signature_name=signature_name, resume=resume,
        labels=(",".join(f"{k}={v}" for k, v in labels.items()),) if labels else ())
    notes, shown, echo = _noted(job_id, progress)
    try:
        submission.submit_prediction(spec, runner, EngineOptions(**options), echo,
                                     stream=False)
    finally:
        shown.close()
    return Job(job_id, notes=notes)


def get_job(job_id: str) -> Job:
    """The job of this id (JobNotFoundError when the index has none)."""
    return Job(job_id)


def select(filter: str | None = None, *, sort_by: str | None = None,
           limit: int | None = None) -> list[records.JobRecord]:
    """The index's summaries (records without their bulky fields) of the jobs `filter`
    chooses, oldest first (or by `sort_by`): what `list_jobs` and `jobs list` list."""
    from submit import job_index
    return listing.select(job_index.summaries(), filter_text=filter, sort_by=sort_by,
                          limit=limit)


def list_jobs(filter: str | None = None, *, sort_by: str | None = None,
              limit: int | None = None) -> list[Job]:
    """Jobs in the local index, oldest first; `filter` is gcloud's expression language
    (`state=RUNNING OR labels.team:*`), as `jobs list --filter`."""
    out = []
    for light in select(filter, sort_by=sort_by, limit=limit):
        try:
            out.append(Job(light.job_id))
        except SubmitError:  # removed meanwhile
            continue
    return out


def _submit_option(call: str, name: str, value: Any) -> None:
    """A `submit(**options)` keyword: a flag's (checked as its `specs.Flags` field is
    annotated) or a runner option's (a string)."""
    flags = _flag_hints()
    where = f"{call}({name}=...)"
    if name in flags:
        hint = flags[name]
        if name == "packages":
            hint = str | Sequence[str] | None
        api_checks.check(value, hint, where)
    elif name in runners.declared_options() or name in SHARED:
        api_checks.check(value, str | None, where)
    # any other name: run_submission refuses it as an unknown option


def _flag_hints() -> dict[str, Any]:
    return typing.get_type_hints(specs.Flags)


api_checks.guard(globals(), {"submit": _submit_option})
