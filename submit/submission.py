"""Submitting a job: flags and config.yaml -> JobSpec -> package -> the runner's job.

The same steps for every runner (`submit.runners.engine.Runner`'s verbs, driven by
`submit.lifecycle`): resolve and check the spec, build (or fetch) and hash the package,
render the runner's job (what `--dry-run` prints), stage the package, start the job and
record it, then stay with it until it ends or return at once (`--async`). Everything
that can be refused is refused before anything is built, staged or started. Output goes
through `echo(text, err=False)`, so the CLI module alone decides where lines go.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable

from mljob import startup, storage
from submit import jobs as records
from submit import lifecycle, runners
from submit.packaging import package
from submit.jobdef import spec as specs
from submit.errors import PackageUsageError, UsageError
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
    # custom containers run their own images: no package is built, staged or installed
    containers_only = spec.custom_containers and not spec.package_uri and \
        not spec.package_path and not spec.extra_packages
    builds = not containers_only and not spec.package_uri and (
        spec.package_path or not spec.extra_packages)
    source = package.resolve_source(spec.package_path) if builds else None
    for path in spec.extra_packages:
        if "://" not in path and not os.path.isfile(path):
            raise PackageUsageError(f"--packages {path} is not a file; give the sdists "
                                    "(.tar.gz) or wheels (.whl) to install")
    with tempfile.TemporaryDirectory(prefix="mljob-sdist-") as tmp:
        pkg = None if containers_only else with_extras(
            spec, (_fetch(spec.package_uri, tmp, request.dry_run) if spec.package_uri
                   else build_package(spec, source, tmp, request.dry_run) if source
                   else None),
            tmp, request.dry_run)
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
        for each in pkg.all if pkg else ():
            if each.local_file and not _given_url(spec, each):
                assert each.url is not None  # with_extras gives every archive its URL
                package.stage(each, each.url)
        startup.mark("staged")
    return start(runner, rendered, lifecycle.new_record(runner, spec, pkg, rendered), echo,
                 stream=request.stream)


def start(runner: Runner, rendered: Rendered, record: records.JobRecord, echo: Echo, *,
          stream: bool) -> int:
    """Start a rendered job on its runner; stay with it when `stream`."""
    echo(lifecycle.start(runner, rendered, record, attach=stream))
    if not stream:
        echo(lifecycle.detached_hint(record), err=True)  # a hint: stdout stays the result
        return 0
    return lifecycle.attach(runner, rendered, record, echo)


def build_package(spec: specs.JobSpec, source: package.Source, tmp: str,
                  dry_run: bool = False) -> package.Package:
    """The sdist of `source` (one built earlier from the same files when there is one:
    a dry run keeps nothing new), hashed, with the URL it will be staged to."""
    job_dir = spec.job_dir
    exclude = (storage.local_path(job_dir),) if job_dir and storage.is_local(job_dir) else ()
    return _staged(spec, package.build(source, tmp, exclude=exclude, keep=not dry_run))


def _fetch(url: str, folder: str, dry_run: bool) -> package.Package:
    """A staged archive, downloaded; a dry run reads nothing remote (no download, no
    hash: package.unfetched)."""
    if dry_run and not storage.is_local(url):
        return package.unfetched(url)
    return package.fetch(url, folder)


def with_extras(spec: specs.JobSpec, main: package.Package | None,
                tmp: str, dry_run: bool = False) -> package.Package:
    """The job's packages: the main one (else the first --packages archive), the other
    archives, and mljob's core when the user's code imports mljob and does not ship it
    (not known, so not added, for archives a dry run leaves where they are)."""
    archives = []
    for i, path in enumerate(spec.extra_packages):
        if "://" in path:  # already staged: installed from where it is
            folder = os.path.join(tmp, f"extra-{i}")
            os.makedirs(folder)
            archives.append(_fetch(path, folder, dry_run))
        else:
            archives.append(_staged(spec, package.describe(os.path.abspath(path))))
    if main is None:
        main, archives = archives[0], archives[1:]
    found = (main, *archives)
    if not any(p.dist_name == "mljob" for p in found) and any(
            p.local_file and package.imports_mljob(p) for p in found):
        core_dir = os.path.join(tmp, "mljob-core")
        archives.append(_staged(spec, package.build_mljob_core(core_dir,
                                                                  keep=not dry_run)))
    return dataclasses.replace(main, extras=tuple(archives))


def _staged(spec: specs.JobSpec, pkg: package.Package) -> package.Package:
    return dataclasses.replace(pkg, url=package.staging_url(
        pkg, job_id=spec.job_id, staging_bucket=spec.staging_bucket, job_dir=spec.job_dir))


def _given_url(spec: specs.JobSpec, pkg: package.Package) -> bool:
    """Whether the archive was given as a URL (packageUris, --packages gs://...)."""
    return pkg.url == spec.package_uri or pkg.url in spec.extra_packages


def check_job_id_free(spec: specs.JobSpec, resume: bool, runner: str = "local") -> None:
    """A job id is used once: in its job dir, and in the local index (unless --resume
    continues the same job: same job dir, same runner)."""
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
    if not (resume and old.job_dir and old.job_dir == spec.job_dir
            and old.runner == runner):
        # job ids are unique, as in a gcloud project: the index entry is never replaced
        again = (f", or pass --resume with --job-dir {old.job_dir} to continue it"
                 if old.job_dir else "")
        raise UsageError(f"job id {spec.job_id!r} already exists ({old.state}, job dir "
                         f"{old.job_dir or 'none'}, runner {old.runner}); pick another "
                         f"job id{again}")


def runner_for(record: records.JobRecord) -> Runner:
    """The runner a recorded job runs on, for `jobs describe / stream-logs / cancel`."""
    tuning = "hyperparameters" in (record.training_input or {})
    return runners.get(record.runner, tuning=tuning)(EngineOptions())
