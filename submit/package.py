"""The training package: sdist, content hash, staging, safe extraction, per-package env.

As gcloud does, the package folder (the one holding setup.py) is built into an sdist in
a temporary copy (so concurrent builds never share `*.egg-info` or `build/`), hashed, and
uploaded to `<staging-bucket>/<job-id>/<sha256>/<file>` or
`<job-dir>/packages/<sha256>/<file>`. The hash covers the sorted member names and file
contents of the archive, not its timestamps, so rebuilding unchanged sources gives the
same hash, hence the same staged path and the same environment.

Replicas run the staged package, never the working tree: the runner downloads it, checks
the hash, and extracts it into `$MLJOB_HOME/envs/<sha256>/src/`, which then goes on the
replicas' PYTHONPATH (TensorFlow and the other dependencies come from this interpreter).
An environment is built in a temporary folder and renamed into place, so a concurrent or
interrupted build never leaves half of one; a later job with the same hash reuses it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import posixpath
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid

from submit.errors import PackageError, PackageUsageError
from mljob import storage
from mljob.errors import first_line

log = logging.getLogger(__name__)

# Never copied into the build folder: VCS data, caches, build outputs and job outputs.
COPY_IGNORE = (".git", ".hg", "__pycache__", "*.pyc", "*.egg-info", "build", "dist",
               ".pytest_cache", ".hypothesis", "jobs", ".venv", "venv", "node_modules")
SDIST_TIMEOUT_S = 300
# Bounds on a package read from storage (packageUris, or a staged file someone replaced):
# an sdist is kilobytes to a few megabytes, so these leave room for packages that ship
# data while a tar bomb stops at a declared size before it is expanded.
MAX_PACKAGE_BYTES = 512 * 1024 * 1024       # the archive as stored
MAX_EXTRACTED_BYTES = 2 * 1024 * 1024 * 1024  # the members' declared sizes, summed
MAX_MEMBERS = 100_000


@dataclasses.dataclass(frozen=True)
class Package:
    """A built or staged sdist: its file name, content hash, top folder and staged URL."""

    file_name: str
    sha256: str
    top_dir: str
    url: str | None = None
    local_file: str | None = None


def mljob_home() -> str:
    return os.path.abspath(os.path.expanduser(os.environ.get("MLJOB_HOME") or "~/.mljob"))


def default_package_path() -> str | None:
    """This project's own source tree (the folder holding setup.py), if it is one."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return root if os.path.isfile(os.path.join(root, "setup.py")) else None


def check_package_path(path: str | None) -> str:
    if path is None:
        path = default_package_path()
        if path is None:
            raise PackageUsageError("no --package-path given and mljob is not running from "
                                    "its source tree; pass --package-path DIR (a folder "
                                    "holding setup.py)")
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        raise PackageUsageError(f"--package-path {path} is not a folder; pass the folder "
                                "holding your setup.py")
    if not os.path.isfile(os.path.join(path, "setup.py")):
        raise PackageUsageError(f"--package-path {path} has no setup.py; add one (a "
                                "15-line setuptools setup() does) or pass the right folder")
    return path


def build(package_path: str, out_dir: str, *, exclude: tuple[str, ...] = ()) -> Package:
    """Build the sdist of package_path into out_dir; `exclude` lists absolute paths
    (a local job dir inside the package folder) left out of the copy."""
    work = tempfile.mkdtemp(prefix="mljob-build-")
    try:
        src = os.path.join(work, "src")
        ignore_names = shutil.ignore_patterns(*COPY_IGNORE)
        excluded = {os.path.realpath(p) for p in exclude}

        def ignore(folder, names):
            skipped = set(ignore_names(folder, names))
            return skipped | {n for n in names
                              if os.path.realpath(os.path.join(folder, n)) in excluded}

        shutil.copytree(package_path, src, ignore=ignore, symlinks=True)
        dist = os.path.join(work, "dist")
        try:
            proc = subprocess.run(
                [sys.executable, "setup.py", "-q", "sdist", "--formats=gztar",
                 "--dist-dir", dist], cwd=src, capture_output=True, text=True,
                timeout=SDIST_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise PackageError(f"setup.py sdist in {package_path} took over "
                               f"{SDIST_TIMEOUT_S} s; check setup.py") from None
        built = [f for f in os.listdir(dist)] if os.path.isdir(dist) else []
        if proc.returncode != 0 or len(built) != 1:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise PackageError(f"setup.py sdist failed in {package_path}: {tail[0]}")
        os.makedirs(out_dir, exist_ok=True)
        target = os.path.join(out_dir, built[0])
        shutil.move(os.path.join(dist, built[0]), target)
        return describe(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def describe(tar_path: str, url: str | None = None) -> Package:
    """Hash an sdist and find its top folder (refusing archives that are not one)."""
    sha256, top = content_hash(tar_path)
    return Package(os.path.basename(tar_path), sha256, top, url=url, local_file=tar_path)


def content_hash(tar_path: str) -> tuple[str, str]:
    """sha256 over the sorted member names, types and file contents; and the top folder."""
    digest = hashlib.sha256()
    try:
        with tarfile.open(tar_path, "r:*") as tar:
            members = sorted(_members(tar, tar_path), key=lambda m: m.name)
            tops = {m.name.split("/", 1)[0] for m in members}
            for member in members:
                digest.update(f"{member.name}\0{member.type.decode()}\0{member.linkname}\0"
                              .encode())
                if member.isfile():
                    with tar.extractfile(member) as f:
                        while chunk := f.read(1 << 20):
                            digest.update(chunk)
                    digest.update(b"\0")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise PackageError(f"{tar_path} is not a readable .tar.gz: {exc}") from None
    if len(tops) != 1:
        raise PackageUsageError(f"{os.path.basename(tar_path)} is not an sdist: it must "
                                "hold one top folder (name-version/)")
    return digest.hexdigest(), tops.pop()


def _members(tar: tarfile.TarFile, tar_path: str) -> list[tarfile.TarInfo]:
    """The archive's members, stopping (before reading further) once their count or
    declared sizes pass the bounds: a small archive can expand to terabytes."""
    members, total = [], 0
    for member in tar:
        members.append(member)
        total += member.size
        if len(members) > MAX_MEMBERS or total > MAX_EXTRACTED_BYTES:
            raise PackageUsageError(
                f"{os.path.basename(tar_path)} expands to more than "
                f"{MAX_MEMBERS} members or {MAX_EXTRACTED_BYTES} bytes; a training package "
                "holds code (keep data in storage and read it with --data-dir)")
    return members


def _naming(url: str, exc: BaseException) -> str:
    """The exception's first line, naming the URL once (storage's messages name it)."""
    text = first_line(exc)
    return text if url in text else f"{url}: {text}"


def _download(url: str) -> bytes:
    """A staged package's bytes, at most MAX_PACKAGE_BYTES."""
    try:
        return storage.read_bytes(url, limit=MAX_PACKAGE_BYTES)
    except storage.TooLargeError:
        raise PackageUsageError(f"the package {url} is larger than {MAX_PACKAGE_BYTES} "
                                "bytes; a training package holds code") from None


def staging_url(package: Package, *, job_id: str, staging_bucket: str | None,
                job_dir: str | None) -> str:
    if staging_bucket:
        return storage.join(staging_bucket, job_id, package.sha256, package.file_name)
    if job_dir:
        return storage.join(job_dir, "packages", package.sha256, package.file_name)
    raise PackageUsageError("If local packages are provided, the --staging-bucket or "
                            "--job-dir flag must be given.")


def stage(package: Package, url: str) -> Package:
    """Upload the sdist to its staging URL (skipped when that exact file is already there)."""
    try:
        if not storage.exists(url):
            with open(package.local_file, "rb") as f:
                storage.write_bytes(url, f.read())  # atomic locally; sdists are small
    except (storage.StorageError, OSError) as exc:
        raise PackageError(f"cannot stage the package to {url}: {exc}") from None
    return dataclasses.replace(package, url=url)


def fetch(url: str, out_dir: str) -> Package:
    """Download a staged package (packageUris) and describe it."""
    try:
        data = _download(url)
    except FileNotFoundError:
        raise PackageUsageError(f"staged package {url} does not exist; check packageUris") \
            from None
    except (storage.StorageError, OSError) as exc:
        raise PackageError(f"cannot download the package: {_naming(url, exc)}") from None
    path = os.path.join(out_dir, posixpath.basename(url) or "package.tar.gz")
    with open(path, "wb") as f:
        f.write(data)
    return describe(path, url=url)


def safe_extract(tar_path: str, dest: str) -> None:
    """Extract, refusing members that would land (or point) outside dest."""
    root = os.path.realpath(dest)
    os.makedirs(root, exist_ok=True)
    with tarfile.open(tar_path, "r:*") as tar:
        members = _members(tar, tar_path)
        for member in members:
            _check_member(member, root)
        tar.extractall(root, members=members, filter="data")


def _check_member(member: tarfile.TarInfo, root: str) -> None:
    name = member.name
    if name.startswith("/") or os.path.isabs(name) or ".." in name.split("/"):
        raise PackageUsageError(f"package member {name!r} escapes its folder; refusing to "
                                "extract the archive (rebuild it with setup.py sdist)")
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise PackageUsageError(f"package member {name!r} is a device or fifo; refusing to "
                                "extract the archive")
    if member.issym() or member.islnk():
        base = os.path.dirname(os.path.join(root, name)) if member.issym() else root
        target = os.path.realpath(os.path.join(base, member.linkname))
        if os.path.isabs(member.linkname) or not _inside(target, root):
            raise PackageUsageError(f"package member {name!r} links to {member.linkname!r} "
                                    "outside its folder; refusing to extract the archive")
    if not _inside(os.path.realpath(os.path.join(root, name)), root):
        raise PackageUsageError(f"package member {name!r} escapes its folder; refusing to "
                                "extract the archive")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def env_dir(sha256: str, home: str | None = None) -> str:
    return os.path.join(home or mljob_home(), "envs", sha256)


def ensure_environment(url: str, sha256: str, top_dir: str, *,
                       home: str | None = None) -> tuple[str, bool]:
    """The package's import root under envs/<sha256>/src, and whether it was built now.

    Built in a temporary sibling and renamed into place: the rename is atomic, so the
    folder either does not exist or is complete, and a concurrent builder's rename loses
    quietly (its copy is removed and the winner's is used).
    """
    target = env_dir(sha256, home)
    import_root = os.path.join(target, "src", top_dir)
    if os.path.isdir(import_root):
        log.info("package environment %s reused", sha256[:12])
        return import_root, False
    envs = os.path.dirname(target)
    os.makedirs(envs, exist_ok=True)
    tmp = os.path.join(envs, f".tmp-{sha256[:12]}-{uuid.uuid4().hex[:8]}")
    try:
        os.makedirs(tmp)
        archive = os.path.join(tmp, "package.tar.gz")
        try:
            data = _download(url)
        except (FileNotFoundError, storage.StorageError, OSError) as exc:
            raise PackageError(f"cannot download the staged package: {_naming(url, exc)}") \
                from None
        with open(archive, "wb") as f:
            f.write(data)
        got, top = content_hash(archive)
        if got != sha256 or top != top_dir:
            raise PackageError(f"the staged package {url} changed since it was staged "
                               f"(sha256 {got[:12]}, expected {sha256[:12]}); submit again")
        safe_extract(archive, os.path.join(tmp, "src"))
        os.remove(archive)
        with open(os.path.join(tmp, "package.json"), "w") as f:
            json.dump({"url": url, "sha256": sha256, "top_dir": top_dir,
                       "created": time.time()}, f)
        try:
            os.rename(tmp, target)
        except OSError:
            if not os.path.isdir(import_root):
                raise
            log.info("package environment %s reused (built concurrently)", sha256[:12])
            return import_root, False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("package environment %s created", sha256[:12])
    return import_root, True

