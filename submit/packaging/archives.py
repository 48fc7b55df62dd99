"""Package archives (sdists and wheels): what they are called, their content hashes,
their members checked and bounded before anything is extracted or installed, and
reading a staged one back.

The hash covers the sorted member names and file contents of the archive, not its
timestamps, so rebuilding unchanged sources gives the same hash, hence the same staged
path and the same environment.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import tarfile
import zipfile

from mljob import storage
from mljob.errors import first_line
from submit.errors import PackageError, PackageUsageError

ARCHIVE_SUFFIXES = (".tar.gz", ".whl")

# Bounds on a package read from storage (packageUris, or a staged file someone replaced):
# an sdist is kilobytes to a few megabytes, so these leave room for packages that ship
# data while a tar bomb stops at a declared size before it is expanded.
MAX_PACKAGE_BYTES = 512 * 1024 * 1024       # the archive as stored
MAX_EXTRACTED_BYTES = 2 * 1024 * 1024 * 1024  # the members' declared sizes, summed
MAX_MEMBERS = 100_000


@dataclasses.dataclass(frozen=True)
class Package:
    """A built or staged sdist (or wheel): its file name, content hash, top folder (empty
    for a wheel) and staged URL. `extras` are the archives installed with it: the
    `--packages` ones, then mljob's core when the user's code imports mljob."""

    file_name: str
    sha256: str
    top_dir: str
    url: str | None = None
    local_file: str | None = None
    extras: tuple["Package", ...] = ()

    @property
    def all(self) -> tuple["Package", ...]:
        """This package and its extras, in install order."""
        return (self, *self.extras)

    @property
    def dist_name(self) -> str:
        """The distribution name its file name gives, as pip normalises it (PEP 503):
        `trainer-0.1.tar.gz` trainer, `census-trainer-0.1.tar.gz` (an older setuptools'
        sdist) and `Census_Trainer-0.1-py3-none-any.whl` census-trainer."""
        return dist_name(self.file_name)


def dist_name(file_name: str) -> str:
    if file_name.endswith(".whl"):  # name-version-...: the name's dashes are escaped
        name = file_name.split("-", 1)[0]
    else:  # name-version.tar.gz: the version is what starts with a digit after a dash
        stem = re.sub(r"\.(tar\.gz|tgz|tar\.bz2|tar\.xz|tar|zip)$", "", file_name)
        found = re.match(r"^(.+?)-v?[0-9][^-]*$", stem)
        name = found.group(1) if found else stem
    return re.sub(r"[-_.]+", "-", name).lower()


def describe(path: str, url: str | None = None) -> Package:
    """Hash an sdist or wheel and find an sdist's top folder (refusing archives that are
    neither)."""
    sha256, top = content_hash(path)
    return Package(os.path.basename(path), sha256, top, url=url, local_file=path)


def check_archive_name(name: str, where: str) -> None:
    if not name.endswith(ARCHIVE_SUFFIXES) or name.startswith("."):
        raise PackageUsageError(f"{where} {name!r} is not an sdist or a wheel; give "
                                "NAME-VERSION.tar.gz or .whl files")


def content_hash(path: str) -> tuple[str, str]:
    """sha256 over the sorted member names, types and file contents (never timestamps);
    and the top folder of an sdist ("" for a wheel)."""
    if path.endswith(".whl"):
        return _wheel_hash(path), ""
    digest = hashlib.sha256()
    try:
        with tarfile.open(path, "r:*") as tar:
            members = sorted(_members(tar, path), key=lambda m: m.name)
            tops = {m.name.split("/", 1)[0] for m in members}
            for member in members:
                digest.update(f"{member.name}\0{member.type.decode()}\0{member.linkname}\0"
                              .encode())
                if member.isfile():
                    data = tar.extractfile(member)
                    assert data is not None  # a regular file's member has its data
                    with data as f:
                        while chunk := f.read(1 << 20):
                            digest.update(chunk)
                    digest.update(b"\0")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise PackageError(f"{path} is not a readable .tar.gz: {exc}") from None
    if len(tops) != 1:
        raise PackageUsageError(f"{os.path.basename(path)} is not an sdist: it must "
                                "hold one top folder (name-version/)")
    return digest.hexdigest(), tops.pop()


def _wheel_hash(path: str) -> str:
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(path) as wheel:
            for info in sorted(_zip_members(wheel, path), key=lambda i: i.filename):
                digest.update(f"{info.filename}\0".encode())
                with wheel.open(info) as f:  # streamed: a member may expand far
                    while chunk := f.read(1 << 20):
                        digest.update(chunk)
                digest.update(b"\0")
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise PackageError(f"{path} is not a readable wheel: {exc}") from None
    return digest.hexdigest()


def _zip_members(wheel: zipfile.ZipFile, path: str) -> list[zipfile.ZipInfo]:
    """A wheel's members, bounded like an sdist's (count, and declared sizes summed;
    zipfile never decompresses past a member's declared size)."""
    members = wheel.infolist()
    total = sum(i.file_size for i in members)
    if len(members) > MAX_MEMBERS or total > MAX_EXTRACTED_BYTES:
        raise PackageUsageError(
            f"{os.path.basename(path)} expands to more than {MAX_MEMBERS} members or "
            f"{MAX_EXTRACTED_BYTES} bytes; a training package holds code (keep data in "
            "storage and read it with --data-dir)")
    return members


_IMPORTS_MLJOB = re.compile(rb"\s*(from\s+mljob[\s.]|import\s+mljob\b)")


_REQUIRES_MLJOB = re.compile(rb"(Requires-Dist:\s*)?mljob(?![\w.-])", re.I)  # not mljob-x


def imports_mljob(package: Package) -> bool:
    """Whether the archive's Python files import mljob (or it requires mljob); read a
    line at a time, never a member whole (one may expand to gigabytes)."""
    assert package.local_file is not None  # callers ask only of archives on this machine
    for name, stream in _python_files(package.local_file):
        pattern = _IMPORTS_MLJOB if name.endswith(".py") else _REQUIRES_MLJOB
        with stream:
            if any(pattern.match(line) for line in _lines(stream)):
                return True
    return False


def _lines(stream, keep: int = 4096):
    """The stream's lines, each cut to its first `keep` bytes, read 1 MB at a time."""
    rest = b""
    while chunk := stream.read(1 << 20):
        *lines, tail = (rest + chunk).split(b"\n")
        yield from (line[:keep] for line in lines)
        rest = tail if len(tail) <= keep else tail[:keep]  # a long line's start is kept
    yield rest


def _python_files(path: str):
    """(name, binary stream) of the .py files and metadata in an sdist or wheel."""
    wanted = (".py", "requires.txt", "METADATA", "PKG-INFO")
    if path.endswith(".whl"):
        with zipfile.ZipFile(path) as wheel:
            for info in _zip_members(wheel, path):
                if info.filename.endswith(wanted):
                    yield info.filename, wheel.open(info)
        return
    with tarfile.open(path, "r:*") as tar:
        for member in _members(tar, path):
            if member.isfile() and member.name.endswith(wanted):
                data = tar.extractfile(member)
                assert data is not None  # a regular file's member has its data
                yield member.name, data


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


def _read_package(url: str) -> bytes:
    """A staged package's bytes, at most MAX_PACKAGE_BYTES."""
    try:
        return storage.read_bytes(url, limit=MAX_PACKAGE_BYTES)
    except storage.TooLargeError:
        raise PackageUsageError(f"the package {url} is larger than {MAX_PACKAGE_BYTES} "
                                "bytes; a training package holds code") from None


def _naming(exc: BaseException, url: str) -> str:
    """An error's text naming the URL once: storage's own errors already name it."""
    text = first_line(exc)
    return text if url in text else f"{url}: {text}"


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


def check_members(path: str) -> None:
    """Refuse an archive with members that would land (or point) outside its folder."""
    if path.endswith(".whl"):
        with zipfile.ZipFile(path) as wheel:
            for name in (i.filename for i in _zip_members(wheel, path)):
                if name.startswith("/") or ".." in name.split("/"):
                    raise PackageUsageError(f"package member {name!r} escapes its folder; "
                                            "refusing to install the wheel")
        return
    root = os.path.realpath(os.path.dirname(path))
    with tarfile.open(path, "r:*") as tar:
        for member in _members(tar, path):
            _check_member(member, root)
