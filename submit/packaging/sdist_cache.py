"""Sdists kept from earlier builds: an unchanged package is not built again.

`python -m build --sdist` takes seconds (an interpreter, setuptools, the backend's
hooks) and gives the same archive for the same inputs, so every build is kept under
`$MLJOB_SDIST_CACHE` (default `$MLJOB_HOME/sdists`), named by the key of what went in:

- every file the build copies (path, type, permission bits, contents, a symlink's
  target), walked with the build's own ignore rules, so any edit, added or removed
  file, setup.py or pyproject.toml change gives another key;
- how it is built: as it is, or with the generated setup.py (its text, name, version
  and requirements);
- the interpreter (its path and version) and the versions of the build frontend and
  backend (setuptools, build, wheel, and what `[build-system] requires` names);
- the environment variables build backends read (`SETUPTOOLS_*`, `HATCH_*`, ...).

The key of a stored sdist is taken from the build's own copy of the files, not the
folder, so a file edited while the build ran cannot be stored under the key of its
old contents. A setup.py that reads anything else (the clock, the network, other
variables) should build with `MLJOB_SDIST_CACHE=0`.

A kept sdist is used only when its folder and the cache are this user's and not
writable by everyone, its record names the key, and the archive's content hash is
still the one recorded at build time; anything else rebuilds. Entries are published
by one rename (a reader sees a complete entry or none) and the oldest are dropped
beyond `MAX_ENTRIES`. Failing to read or write the cache never fails a submission.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import stat
import sys
import uuid
from collections.abc import Callable, Iterable

from mljob.procs import pid_alive
from submit.packaging.archives import Package, describe
from submit.home import mljob_home
from submit.errors import PackageError

log = logging.getLogger(__name__)

CACHE_ENV = "MLJOB_SDIST_CACHE"   # a folder, or 0/off to build every time
FORMAT = 1                        # bumped when what goes into the key changes
MAX_ENTRIES = 32
RECORD = "mljob-sdist.json"       # written before the entry is published
TOOLS = ("setuptools", "build", "wheel", "packaging", "pyproject_hooks")
ENV_PREFIXES = ("SETUPTOOLS_", "DISTUTILS_", "PBR_", "HATCH_", "FLIT_", "PDM_", "POETRY_",
                "MATURIN_", "SKBUILD_", "CMAKE_", "SOURCE_DATE_EPOCH", "MLJOB_VERSION")
_ENTRY = re.compile(r"[0-9a-f]{64}")
_BUILDING = re.compile(r"\.([0-9a-f]{64})\.([0-9]+)-[0-9a-f]{8}")

Ignore = Callable[[str, list[str]], Iterable[str]]


def root() -> str | None:
    """The cache folder, or None when MLJOB_SDIST_CACHE turns it off."""
    value = (os.environ.get(CACHE_ENV) or "").strip()
    if value.lower() in ("0", "off", "false", "no"):
        return None
    if value:
        return os.path.abspath(os.path.expanduser(value))
    return os.path.join(mljob_home(), "sdists")


def key(tree: str, recipe: dict, ignore: Ignore | None = None) -> str | None:
    """The key of building `tree` (with `ignore`, as the build copies it) by `recipe`,
    or None when it cannot be known (an unreadable file, a pyproject.toml this Python
    cannot read): such a build is not cached. None too when the cache is off."""
    if root() is None:
        return None
    digest = hashlib.sha256()
    try:
        _digest_tree(digest, tree, "", ignore)
        requires = _build_requires(os.path.join(tree, "pyproject.toml"))
    except (OSError, ValueError):
        return None
    if requires is None:
        return None
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(ENV_PREFIXES))
    header = json.dumps({"format": FORMAT, "recipe": recipe,
                         "python": [os.path.realpath(sys.executable), sys.version],
                         "tools": {name: _version(name)
                                   for name in sorted({*TOOLS, *requires})},
                         "env": env}, sort_keys=True)
    digest.update(b"\0header\0" + header.encode())
    return digest.hexdigest()


def _digest_tree(digest, folder: str, rel: str, ignore: Ignore | None) -> None:
    """What `shutil.copytree(folder, ..., ignore=ignore, symlinks=True)` copies:
    symlinks as links, directories walked, files with their permission bits."""
    names = os.listdir(folder)
    skipped = set(ignore(folder, names)) if ignore else set()
    for name in sorted(n for n in names if n not in skipped):
        path, where = os.path.join(folder, name), f"{rel}/{name}"
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            digest.update(f"L\0{where}\0{os.readlink(path)}\0".encode())
        elif stat.S_ISDIR(info.st_mode):
            digest.update(f"D\0{where}\0".encode())
            _digest_tree(digest, path, where, ignore)
        else:
            digest.update(f"F\0{where}\0{stat.S_IMODE(info.st_mode):o}\0"
                          f"{info.st_size}\0".encode())
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)


def _build_requires(pyproject: str) -> list[str] | None:
    """The distribution names `[build-system] requires` lists ([] without one), or None
    when there is a pyproject.toml this Python cannot read."""
    if not os.path.isfile(pyproject):
        return []
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return None
    try:
        with open(pyproject, "rb") as f:
            table = tomllib.load(f).get("build-system", {})
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    requires = table.get("requires", []) if isinstance(table, dict) else None
    if not isinstance(requires, list):
        return None
    names = [re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", str(r)) for r in requires]
    if not all(names):
        return None
    return [re.sub(r"[-_.]+", "_", m.group(1).lower()) for m in names if m]


def _version(name: str) -> str:
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def _private(path: str) -> bool:
    info = os.lstat(path)
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() \
        and not info.st_mode & 0o002


def lookup(cache_key: str | None, out_dir: str) -> Package | None:
    """The sdist kept under `cache_key`, copied into out_dir and hashed; None when
    there is none or it fails a check (then it is removed)."""
    folder = root()
    if cache_key is None or folder is None:
        return None
    entry = os.path.join(folder, cache_key)
    try:
        if not os.path.lexists(entry):
            return None
        reason = _untrusted(folder, entry, cache_key)
        if reason is None:
            with open(os.path.join(entry, RECORD)) as f:
                record = json.load(f)
            os.makedirs(out_dir, exist_ok=True)
            target = os.path.join(out_dir, os.path.basename(record["file_name"]))
            shutil.copyfile(os.path.join(entry, record["file_name"]), target)
            package = describe(target)
            if package.sha256 == record["sha256"]:
                os.utime(entry)  # recently used: dropped last
                log.info("sdist %s reused (built earlier from the same files)",
                         package.file_name)
                return package
            os.remove(target)
            reason = "its archive changed since it was built"
    except (OSError, ValueError, KeyError, TypeError, PackageError) as exc:
        reason = f"unreadable ({exc})"
    log.warning("kept sdist %s is not used: %s; building again", entry, reason)
    if os.path.islink(entry):
        os.unlink(entry)
    elif os.path.isdir(entry):
        shutil.rmtree(entry, ignore_errors=True)
    return None


def _untrusted(folder: str, entry: str, cache_key: str) -> str | None:
    if not _private(folder):
        return "the cache folder is not this user's or is writable by everyone"
    if not _private(entry):
        return "it is not a folder of this user's, or it is writable by everyone"
    with open(os.path.join(entry, RECORD)) as f:
        record = json.load(f)
    if record.get("key") != cache_key or os.sep in str(record.get("file_name", os.sep)):
        return "its record does not match its name"
    return None


def store(cache_key: str | None, package: Package) -> None:
    """Keep the built sdist under `cache_key` (a concurrent builder's entry wins)."""
    folder = root()
    if cache_key is None or folder is None or package.local_file is None:
        return
    building = os.path.join(folder, f".{cache_key}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.makedirs(building, mode=0o700)
        shutil.copyfile(package.local_file, os.path.join(building, package.file_name))
        with open(os.path.join(building, RECORD), "w") as f:
            json.dump({"key": cache_key, "file_name": package.file_name,
                       "sha256": package.sha256}, f)
        try:
            os.rename(building, os.path.join(folder, cache_key))
        except OSError:  # published meanwhile by another build of the same files
            pass
        _prune(folder)
    except OSError as exc:
        log.warning("the sdist is not kept for the next build: %s", exc)
    finally:
        shutil.rmtree(building, ignore_errors=True)


def _prune(folder: str) -> None:
    """Drop the least recently used entries beyond MAX_ENTRIES, and builds abandoned by
    killed processes."""
    entries = []
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        building = _BUILDING.fullmatch(name)
        if building and not pid_alive(int(building.group(2))):
            shutil.rmtree(path, ignore_errors=True)
        elif _ENTRY.fullmatch(name):
            try:
                entries.append((os.lstat(path).st_mtime, path))
            except OSError:
                continue
    for _, path in sorted(entries)[:-MAX_ENTRIES]:
        shutil.rmtree(path, ignore_errors=True)


__all__ = ["CACHE_ENV", "key", "lookup", "store", "root"]
