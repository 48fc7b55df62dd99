"""mljob's home: where the job index, records, package environments, sdists and models
live on this machine (`$MLJOB_HOME`, default `~/.mljob`), and the lock files that make
a read-change-write of one of its records take turns between processes."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def mljob_home() -> str:
    return os.path.abspath(os.path.expanduser(os.environ.get("MLJOB_HOME") or "~/.mljob"))


@contextlib.contextmanager
def exclusive(path: str) -> Iterator[None]:
    """Held by one process at a time on this machine: an flock on the file `path` (made
    if missing, never followed through a symlink), released when the block ends."""
    import fcntl
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and the lock with it
