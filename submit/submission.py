"""Submitting a job: flags and config.yaml -> JobSpec -> package -> the runner's job.

The same steps for every runner (`submit.runners.engine.Runner`): resolve and check the
spec, build (or fetch) and hash the package, render the runner's job (what `--dry-run`
prints), stage the package, start the job and record it, then stay with it until it ends
or return at once (`--async`). Everything that can be refused is refused before anything
is built, staged or started. Output goes through `echo(text, err=False)`, so the CLI
module alone decides where lines go.
"""
from __future__ import annotations

import dataclasses
import tempfile
from typing import Any
from collections.abc import Callable, Mapping

from mljob import storage
from submit import jobs as records
from submit import package, runners, spec as specs
from submit.errors import UsageError
from submit.runners.engine import EngineOptions, Runner

Echo = Callable[..., None]


@dataclasses.dataclass(frozen=True)
class Submission:
    """What `python -m submit JOB_ID ...` asked for.

    `resolve` holds the keyword arguments of `submit.spec.resolve` given by flags
    (scale tier, counts, job dir, staging bucket, package path, module, trainer args,
    restart policy); `config_path` is --config."""

    job_id: str
    runner: str = "local"
    options: EngineOptions = EngineOptions()
    config_path: str | None = None
    resolve: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dry_run: bool = False
    stream: bool = True
    resume: bool = False


def submit(request: Submission, echo: Echo) -> int:
    """Run the submission to its end (or to the dry run's print); the exit status."""
    runner = runners.get(request.runner)(request.options)
    training_input = specs.load_config(request.config_path) if request.config_path else {}
    spec = specs.resolve(request.job_id, training_input, **request.resolve)
    runner.check(spec)
    if not request.stream and spec.job_dir and spec.job_dir.startswith("memory://"):
        raise UsageError("--async cannot use a memory:// job dir: the store lives in this "
                         "process, which ends at once; use a path or gs:// URL, or stream")
    if not request.dry_run:  # a dry run reads and writes nothing
        check_job_id_free(spec, request.resume)
    source_dir = None if spec.package_uri else package.check_package_path(spec.package_path)
    with tempfile.TemporaryDirectory(prefix="mljob-sdist-") as tmp:
        if spec.package_uri:  # a dry run reads nothing remote: no download, no hash
            remote = not storage.is_local(spec.package_uri)
            pkg = (package.unfetched(spec.package_uri) if request.dry_run and remote
                   else package.fetch(spec.package_uri, tmp))
        else:
            pkg = build_package(spec, source_dir, tmp)
        rendered = runner.render(spec, pkg)
        for note in runner.prepare(spec, pkg):
            echo(note, err=True)  # stdout stays the job object alone
        if request.dry_run:
            echo(rendered.text)
            return 0
        runner.ready(rendered)
        if spec.package_uri is None:
            package.stage(pkg, pkg.url)
    return start(runner, rendered, runner.new_record(spec, pkg, rendered), echo,
                 stream=request.stream)


def start(runner: Runner, rendered, record: records.JobRecord, echo: Echo, *,
          stream: bool) -> int:
    """Start a rendered job on its runner; stay with it when `stream`."""
    echo(runner.start(rendered, record, attach=stream))
    if not stream:
        echo(runner.detached_hint(record))
        return 0
    return runner.attach(rendered, record, echo)


def build_package(spec: specs.JobSpec, source_dir: str, tmp: str) -> package.Package:
    """The sdist of `source_dir`, hashed, with the URL it will be staged to."""
    local_job_dir = spec.job_dir and storage.is_local(spec.job_dir)
    exclude = (storage.local_path(spec.job_dir),) if local_job_dir else ()
    pkg = package.build(source_dir, tmp, exclude=exclude)
    return dataclasses.replace(pkg, url=package.staging_url(
        pkg, job_id=spec.job_id, staging_bucket=spec.staging_bucket, job_dir=spec.job_dir))


def check_job_id_free(spec: specs.JobSpec, resume: bool) -> None:
    if spec.job_dir and not resume and records.used_in_job_dir(spec.job_dir, spec.job_id):
        raise UsageError(f"job id {spec.job_id!r} is already used in {spec.job_dir}; pick "
                         "another job id, or pass --resume to continue that job")
    try:
        old = records.load(spec.job_id)
    except UsageError:
        return
    if old.running():
        raise UsageError(f"job {spec.job_id!r} is still {old.state}; cancel it with "
                         f"`python -m submit jobs cancel {spec.job_id}` or pick another id")


def runner_for(record: records.JobRecord) -> Runner:
    """The runner a recorded job runs on, for `jobs describe / stream-logs / cancel`."""
    return runners.get(record.runner)(EngineOptions())
