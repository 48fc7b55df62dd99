"""Whether a cached package environment can be trusted before its `bin/python` runs.

`ensure_environment` (submit/packaging/package.py) reuses `<cache>/<key>` when it exists; a job
then runs that folder's interpreter with the job's credentials. So a reused
environment is checked first, and rebuilt when any check fails:

- `<key>` is a symbolic link this cache made: to a sibling folder named
  `<key>.<pid>-<random>` (never a path elsewhere), not itself a link;
- the cache folder and the environment are owned by this user and not writable by
  everyone (another user of a shared cache cannot plant or edit one);
- its completion marker names this key, and the digest it recorded when pip finished
  still matches what is installed: `pyvenv.cfg`, where `bin/python` points, every
  `*.dist-info/RECORD` (pip's list of the files it installed, with their hashes) and
  every `.pth` file (they run code when the interpreter starts).

The digest reads a few small files, not the installed files themselves: it catches a
planted, foreign or half-replaced environment, not an edit by this same user to an
installed module (who could edit the trainer's code as well).
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import stat

BUILD_DIR = re.compile(r"[0-9a-f]{64}\.([0-9]+)-[0-9a-f]{8}")  # <key>.<builder pid>-<random>


def installed_digest(env: str) -> str:
    """sha256 over what pip and venv wrote that decides what the interpreter runs."""
    digest = hashlib.sha256()
    python = os.path.join(env, "bin", "python")
    digest.update(f"python\0{os.path.realpath(python)}\0".encode())
    files = [os.path.join(env, "pyvenv.cfg")]
    for site in sorted(glob.glob(os.path.join(glob.escape(env), "lib", "python*",
                                              "site-packages"))):
        files += sorted(glob.glob(os.path.join(glob.escape(site), "*.dist-info", "RECORD")))
        files += sorted(glob.glob(os.path.join(glob.escape(site), "*.pth")))
    for path in files:
        digest.update(f"{os.path.relpath(path, env)}\0".encode())
        try:
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
        except OSError:
            digest.update(b"missing")
    return digest.hexdigest()


def _private(info: os.stat_result) -> bool:
    """Owned by this user and not writable by everyone (a group-writable folder is
    common under umask 002, with a group of one)."""
    return info.st_uid == os.geteuid() and not info.st_mode & 0o002


def untrusted(root: str, key: str, marker: str) -> str | None:
    """Why `<root>/<key>` is not to be used, or None when it passes every check."""
    link = os.path.join(root, key)
    try:
        if not _private(os.stat(root)):
            return f"the cache {root} is not this user's alone"
        if not stat.S_ISLNK(os.lstat(link).st_mode):
            return "it is not the link this cache makes"
        target = os.readlink(link)
        if os.sep in target or not BUILD_DIR.fullmatch(target) or \
                not target.startswith(key + "."):
            return f"it points to {target[:80]!r}, not to a folder of this cache"
        folder = os.path.join(root, target)
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or not _private(info):
            return "its folder is not this user's alone"
        with open(os.path.join(folder, marker), "rb") as f:
            recorded = json.loads(f.read(1 << 20))
    except (OSError, ValueError) as exc:
        return f"it cannot be read ({getattr(exc, 'strerror', None) or exc})"
    if not isinstance(recorded, dict) or recorded.get("key") != key:
        return "its marker does not name this environment"
    if recorded.get("digest") != installed_digest(folder):
        return "what is installed in it changed since it was built"
    return None


__all__ = ["BUILD_DIR", "installed_digest", "untrusted"]
