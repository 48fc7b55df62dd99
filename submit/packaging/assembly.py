"""A job's packages, assembled from its spec: the main package (built from
--package-path, the project's own source tree, or fetched from packageUris), the other
--packages archives, and mljob's core unless one of them is mljob (every replica runs
the user's module through mljob's launcher); each with the URL it is staged to. A job
of custom containers alone has none. `submit.submission` calls `job_packages` before
the runner renders, and `stage` once nothing can be refused any more."""
from __future__ import annotations

import dataclasses
import os

from mljob import storage
from submit.errors import PackageUsageError
from submit.jobdef import spec as specs
from submit.packaging import package


def job_packages(spec: specs.JobSpec, tmp: str, dry_run: bool = False) -> package.Package | None:
    """The job's packages, built or fetched into `tmp` (a dry run keeps no new sdist and
    reads nothing remote); None for custom containers alone."""
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
    if containers_only:
        return None
    main = (_fetch(spec.package_uri, tmp, dry_run) if spec.package_uri
            else build_package(spec, source, tmp, dry_run) if source else None)
    return with_extras(spec, main, tmp, dry_run)


def stage(spec: specs.JobSpec, pkg: package.Package | None) -> None:
    """Copy each archive built or read here to its staging URL (those given as URLs
    stay where they are)."""
    for each in pkg.all if pkg else ():
        if each.local_file and not _given_url(spec, each):
            assert each.url is not None  # with_extras gives every archive its URL
            package.stage(each, each.url)


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
    archives, and mljob's core unless one of them is mljob: every replica runs the
    user's module through mljob's launcher (`mljob.fitting.launch`)."""
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
    if not any(p.dist_name == "mljob" for p in found):
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
