"""Submitting a job: flags and config.yaml -> JobSpec -> package -> the runner's job;
a batch prediction job: flags -> PredictionSpec -> the runner's job (`submit_prediction`).

The same steps for every runner (`submit.runners.engine.Runner`'s verbs, driven by
`submit.lifecycle`): resolve and check the spec, build (or fetch) and hash the package,
render the runner's job (what `--dry-run` prints), stage the package, start the job and
record it, then stay with it until it ends or return at once (`--async`). Everything
that can be refused is refused before anything is built, staged or started. Output goes
through `echo(text, err=False)`, so the CLI module alone decides where lines go.
"""
from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable

from mljob import startup
from submit import jobs as records
from submit import lifecycle, runners
from submit.packaging import assembly
from submit.jobdef import spec as specs
from submit.errors import UsageError
from submit.prediction.spec import PredictionSpec
from submit.runners.engine import EngineOptions, Rendered, Runner

Echo = Callable[..., None]


@dataclasses.dataclass(frozen=True)
class Submission:
    """What `python -m submit JOB_ID ...` asked for: the job's flags (`flags.job_id` is
    JOB_ID), the runner and its options, and --config."""

    flags: specs.Flags
    runner: str = "local"
    options: EngineOptions = EngineOptions()
    config_path: str | None = None
    dry_run: bool = False
    stream: bool = True
    resume: bool = False


def submit(request: Submission, echo: Echo) -> int:
    """Run the submission to its end (or to the dry run's print); the exit status."""
    startup.mark("cli")  # MLJOB_STARTUP_MARKS=1: where the time before training goes
    runner = runners.get(request.runner)(request.options)
    config = specs.read_config(request.config_path) if request.config_path else None
    spec = specs.resolve(request.flags, config)
    if spec.tuning is not None and request.runner in runners.TUNING:
        runner = runners.get(request.runner, tuning=True)(request.options)
    runner.check(spec)
    startup.mark("spec")
    if not request.stream and spec.job_dir and spec.job_dir.startswith("memory://"):
        raise UsageError("--async cannot use a memory:// job dir: the store lives in this "
                         "process, which ends at once; use a path or gs:// URL, or stream")
    if not request.dry_run:  # a dry run reads and writes nothing
        check_job_id_free(spec, request.resume, request.runner)
    with tempfile.TemporaryDirectory(prefix="mljob-sdist-") as tmp:
        pkg = assembly.job_packages(spec, tmp, request.dry_run)
        startup.mark("package")
        rendered = runner.render(spec, pkg)
        startup.mark("plan")
        for note in rendered.notes:
            echo(note, err=True)  # stdout stays the job object alone
        if request.dry_run:
            echo(rendered.text)
            return 0
        if rendered.blocked:  # before anything is staged
            raise UsageError(rendered.blocked)
        if runner.preflight is not None:
            runner.preflight(rendered)
        assembly.stage(spec, pkg)
        startup.mark("staged")
    return start(runner, rendered, lifecycle.new_record(runner, spec, pkg, rendered), echo,
                 stream=request.stream)


def submit_prediction(spec: PredictionSpec, runner_name: str, options: EngineOptions,
                      echo: Echo, *, dry_run: bool = False, stream: bool = True) -> int:
    """A batch prediction job: the same steps, with no package. The runner renders it
    (checking what it cannot run, `Runner.render_prediction`); a job on this machine
    (a runner that supervises here) is followed to its end unless `stream` is False, a
    job on an engine returns once created, as gcloud's `jobs submit prediction` does."""
    options.check_for(runner_name, prediction=True)
    runner = runners.get(runner_name)(options)
    rendered = runner.render_prediction(spec)
    if not dry_run:  # a dry run creates nothing, so it takes any id
        check_prediction_id_free(spec, runner.name)
    for note in rendered.notes:
        echo(note, err=True)
    if dry_run:
        echo(rendered.text)
        return 0
    if rendered.blocked:
        raise UsageError(rendered.blocked)
    record = lifecycle.new_record(runner, spec, None, rendered)
    return start(runner, rendered, record, echo,
                 stream=stream and runner.supervise_here is not None)


def check_prediction_id_free(spec: PredictionSpec, runner: str) -> None:
    """A batch prediction job's id is used once in the local index too, whichever runner
    takes it: only --resume continues the same job (same runner, same output path). The
    local runner's plan has refused the others already, naming --resume."""
    old = _recorded(spec.job_id)
    if old is None:
        return
    if not (spec.resume and old.runner == runner
            and old.prediction_input.get("outputPath") == spec.output_path):
        raise UsageError(f"job id {spec.job_id!r} already exists ({old.state}, runner "
                         f"{old.runner}); pick another job id")


def start(runner: Runner, rendered: Rendered, record: records.JobRecord, echo: Echo, *,
          stream: bool) -> int:
    """Start a rendered job on its runner; stay with it when `stream`."""
    echo(lifecycle.start(runner, rendered, record, attach=stream))
    if not stream:
        echo(lifecycle.detached_hint(record), err=True)  # a hint: stdout stays the result
        return 0
    return lifecycle.attach(runner, rendered, record, echo)


def check_job_id_free(spec: specs.JobSpec, resume: bool, runner: str = "local") -> None:
    """A job id is used once: in its job dir, and in the local index (unless --resume
    continues the same job: same job dir, same runner)."""
    if spec.job_dir and not resume and records.used_in_job_dir(spec.job_dir, spec.job_id):
        raise UsageError(f"job id {spec.job_id!r} is already used in {spec.job_dir}; pick "
                         "another job id, or pass --resume to continue that job")
    old = _recorded(spec.job_id)
    if old is None:
        return
    if not (resume and old.job_dir and old.job_dir == spec.job_dir
            and old.runner == runner):
        # job ids are unique, as in a gcloud project: the index entry is never replaced
        again = (f", or pass --resume with --job-dir {old.job_dir} to continue it"
                 if old.job_dir else "")
        raise UsageError(f"job id {spec.job_id!r} already exists ({old.state}, job dir "
                         f"{old.job_dir or 'none'}, runner {old.runner}); pick another "
                         f"job id{again}")


def _recorded(job_id: str) -> records.JobRecord | None:
    """The local index's record of a job id a submission asks for (None: the id is
    new), refused in one line while its job still runs, whatever the kind."""
    try:
        old = records.load(job_id)
    except UsageError:
        return None
    old.refuse_if_running()
    return old


def runner_for(record: records.JobRecord) -> Runner:
    """The runner a recorded job runs on, for `jobs describe / stream-logs / cancel`."""
    tuning = "hyperparameters" in (record.training_input or {})
    return runners.get(record.runner, tuning=tuning)(EngineOptions())
