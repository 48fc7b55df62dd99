"""Every output and input location is an fsspec URL: plain paths, file://, memory://, gs://.

TensorFlow writes checkpoints, event files and SavedModels only to local paths here (its
own filesystems know neither memory:// nor a GCS emulator), so the trainer writes to a
local scratch folder and publishes through this module. Publishing is ordered so that a
reader never sees a half-written result:

- local folders are swapped in with one atomic exchange of the new and the old folder
  (Linux's renameat2; elsewhere two renames), and the old copy is removed only after;
- object stores have no rename, so every file is uploaded first and the marker a reader
  looks for (the `checkpoint` state file, `saved_model.pb`) is written last, after the
  previous marker was removed.

Transient storage errors are retried with exponential back-off; a failure that outlasts
the retries raises `StorageError` with a message naming the URL. The budget comes from
env `MLJOB_STORAGE_RETRIES` (attempts, default 6) and `MLJOB_STORAGE_RETRY_DELAY` (first
pause in seconds, default 0.5, doubling up to 8 s), read at each call. gcsfs also retries
every HTTP request itself (6 tries over about 35 s); `MLJOB_STORAGE_REQUEST_RETRIES`, read
at import, caps those tries (1 leaves all retrying to this module).
"""
from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import random
import re
import shutil
import stat
import uuid
from typing import TypeVar
from collections.abc import Callable, Iterable

# Recent gcsfs versions probe each bucket's type over gRPC first, which waits 60 s per
# bucket against an emulator. The switch is read when gcsfs is imported, so set it here,
# before fsspec loads gcsfs, for users who point STORAGE_EMULATOR_HOST at an emulator.
if os.environ.get("STORAGE_EMULATOR_HOST"):
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from mljob.errors import first_line
import fsspec
import tenacity
from fsspec.core import split_protocol, url_to_fs

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_ATTEMPTS = int(os.environ.get("MLJOB_STORAGE_RETRIES", "6"))
RETRY_BASE_DELAY = float(os.environ.get("MLJOB_STORAGE_RETRY_DELAY", "0.5"))
RETRY_MAX_DELAY = 8.0


class StorageError(OSError):
    """Storage failed for good (after retries) or the URL cannot be used."""


class TooLargeError(StorageError):
    """A file holds more bytes than its reader takes (`read_bytes(url, limit=...)`)."""


def filesystem(url: str):
    """(fs, path) for a URL; an unknown scheme, a missing backend or a `..` segment in a
    URL (which object stores keep as a name, and local ones resolve) is a StorageError."""
    check_segments(url)
    try:
        return url_to_fs(url)
    except (ValueError, ImportError) as exc:
        raise StorageError(f"cannot use {url!r}: {first_line(exc, 200)}; "
                           "use a local path, file://, memory:// or gs:// URL") from None


def check_segments(url: str) -> None:
    """Refuse `..` in a URL's path: memory:// and gs:// keep it as part of a name (so
    `gs://b/job/../x` is not `gs://b/x`), and where it resolves it leaves the folder
    the URL names. Plain paths are the user's own and may hold it. Refuse too, on every
    side (submit, predict, the trainer), a `file://` naming no path (it resolved to the
    filesystem root or the current folder) and control characters (a newline in a path
    forges lines in logs)."""
    protocol, path = split_protocol(url)
    if _CONTROL.search(url):
        raise StorageError(f"{url!r:.200} holds a control character; write the path "
                           "without it")
    if protocol is not None and ".." in path.replace("\\", "/").split("/"):
        raise StorageError(f"{url!r} has a '..' segment; write the URL without it")
    if protocol in ("file", "local") and not path:
        raise StorageError(f"{url!r} names no folder; write file:///ABSOLUTE/PATH or "
                           "a plain path")


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def absolute_url(url: str) -> str:
    """The URL every process reads the same way: plain paths and relative `file://` URLs
    made absolute (a replica runs in another folder), an empty `file://` refused, a `..`
    segment in a URL refused. Other schemes come back as given."""
    protocol, path = split_protocol(url)
    if protocol is None:
        return os.path.abspath(url)
    check_segments(url)
    if protocol in ("file", "local"):
        if not path:
            raise StorageError(f"{url!r} names no folder; write file:///ABSOLUTE/PATH or "
                               "a plain path")
        return "file://" + os.path.abspath(path)
    return url


def is_local(url: str) -> bool:
    protocol, _ = split_protocol(url)
    if protocol not in (None, "file", "local"):  # answered without a client: gcsfs's
        return False                             # looks for credentials for seconds
    fs, _ = filesystem(url)
    return "file" in _protocols(fs)


def local_path(url: str) -> str:
    """The local path of a plain path or file:// URL."""
    _, path = filesystem(url)
    return path


def join(url: str, *parts: str) -> str:
    out = url.rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}"
    return out


def exists(url: str) -> bool:
    """Whether URL exists; a local symbolic link loop is a StorageError, not "missing"."""
    fs, path = filesystem(url)
    found = retry(lambda: fs.exists(path), f"check {url}")
    if not found and "file" in _protocols(fs):
        try:
            os.stat(path)
        except OSError as exc:  # a loop in the path or at its end; else simply missing
            if exc.errno == errno.ELOOP:
                raise StorageError(f"cannot read {url}: it is a symbolic link loop, or "
                                   "lies under one; fix the link") from None
    return found


def read_bytes(url: str, limit: int | None = None) -> bytes:
    """The file's bytes; past `limit` bytes a TooLargeError (the rest is never read).

    A local input must be a regular file: a device never ends (/dev/zero) and a named
    pipe blocks until someone writes, so both are refused before they are opened.
    """
    fs, path = filesystem(url)
    if "file" in _protocols(fs):
        _stat_input(url, path)

    def read() -> bytes:  # opened again on each try: a retry starts from byte 0
        with fs.open(path, "rb") as f:
            return f.read() if limit is None else f.read(limit + 1)

    data = retry(read, f"read {url}", missing_ok=False)
    if limit is not None and len(data) > limit:
        raise TooLargeError(f"{url} holds more than {limit} bytes, the most its reader "
                            "takes; check that it is the file you meant")
    return data


def open_input(url: str):
    """A binary file object for reading URL (close it, or use `with`).

    FileNotFoundError when it is missing, IsADirectoryError for a folder, StorageError
    for a local device, named pipe, socket or symbolic link loop.
    """
    fs, path = filesystem(url)
    if "file" in _protocols(fs):
        _stat_input(url, path)
    return retry(lambda: fs.open(path, "rb"), f"open {url}")


def _stat_input(url: str, path: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"{url} does not exist") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StorageError(f"cannot read {url}: it is a symbolic link loop; fix the "
                               "link or point at the file itself") from None
        raise StorageError(f"cannot read {url}: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"{url} is a folder")
    if not stat.S_ISREG(mode):
        kind = ("named pipe" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode)
                else "device")
        raise StorageError(f"cannot read {url}: it is a {kind}, not a regular file; "
                           "copy the data into a file and pass that")


def write_bytes(url: str, data: bytes) -> None:
    """Write a whole small file; local files are replaced atomically with a rename."""
    fs, path = filesystem(url)
    if "file" in _protocols(fs):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return
    retry(lambda: fs.pipe_file(path, data), f"write {url}", creates=True)


def makedirs(url: str) -> None:
    fs, path = filesystem(url)
    retry(lambda: fs.makedirs(path, exist_ok=True), f"create {url}", creates=True)


def upload_file(local: str, url: str) -> None:
    fs, path = filesystem(url)
    retry(lambda: fs.put_file(local, path), f"upload to {url}", creates=True)


def download_tree(url: str, local_dir: str) -> None:
    """Copy everything under URL into local_dir (created); FileNotFoundError when URL
    does not exist (an existing empty folder gives an empty local_dir)."""
    fs, root = filesystem(url)
    files = retry(lambda: fs.find(root), f"list {url}")
    if not files and not retry(lambda: fs.exists(root), f"check {url}"):
        raise FileNotFoundError(f"{url} does not exist")
    os.makedirs(local_dir, exist_ok=True)
    for remote in files:
        rel = os.path.relpath(remote, root) if remote != root else os.path.basename(remote)
        target = os.path.join(local_dir, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        retry(functools.partial(fs.get_file, remote, target), f"download {url}")


def links_leaving(local_dir: str, limit: int = 1) -> list[tuple[str, str]]:
    """(relative path, target) of the symbolic links in local_dir that lead out of it
    (or to a folder holding them: a loop), at most `limit`. A copy follows links, so an
    export or package holding `passwd -> /etc/passwd` would carry that file along."""
    root = os.path.realpath(local_dir)
    found: list[tuple[str, str]] = []
    for dirpath, dirnames, filenames in os.walk(local_dir):  # links to folders: not entered
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                continue
            target = os.path.realpath(path)
            inside = target == root or target.startswith(root + os.sep)
            loop = os.path.isdir(target) and (
                os.path.realpath(dirpath) + os.sep).startswith(target.rstrip(os.sep) + os.sep)
            if not inside or loop:
                found.append((os.path.relpath(path, local_dir), os.readlink(path)))
                if len(found) >= limit:
                    return found
    return found


def upload_tree(local_dir: str, url: str, *, last: Iterable[str] = (),
                skip_existing: bool = False) -> None:
    """Upload local_dir's files under URL; files named in `last` (relative paths) go last.

    skip_existing leaves alone remote files of the same size (event files are appended,
    so their size changes; checkpoint data files never change once written).
    """
    fs, root = filesystem(url)
    last = [os.path.normpath(p) for p in last]
    first: list[str] = []
    final: list[str] = []
    for dirpath, _, names in os.walk(local_dir):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), local_dir)
            (final if rel in last else first).append(rel)
    final.sort(key=last.index)
    remote_sizes = {}
    if skip_existing:
        try:
            remote_sizes = {os.path.relpath(p, root): info.get("size")
                            for p, info in fs.find(root, detail=True).items()}
        except (FileNotFoundError, OSError):
            remote_sizes = {}
    for rel in sorted(first) + final:
        src = os.path.join(local_dir, rel)
        if skip_existing and remote_sizes.get(rel) == os.path.getsize(src):
            continue
        dst = f"{root.rstrip('/')}/{rel.replace(os.sep, '/')}"
        if "file" in _protocols(fs):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
        retry(functools.partial(fs.put_file, src, dst), f"upload to {url}", creates=True)


def publish_dir(local_dir: str, url: str, *, marker: str) -> None:
    """Make URL hold exactly local_dir's contents, never visible half-way.

    Local: copy beside the target, then swap it in with renames. Object stores: remove
    the old marker first (the old result stops being visible), replace the rest, then
    upload the marker last (the new result becomes visible whole).
    """
    fs, path = filesystem(url)
    if "file" in _protocols(fs):
        parent = os.path.dirname(path.rstrip("/")) or "."
        os.makedirs(parent, exist_ok=True)
        token = uuid.uuid4().hex[:8]
        tmp = os.path.join(parent, f".{os.path.basename(path)}.tmp-{token}")
        old = os.path.join(parent, f".{os.path.basename(path)}.old-{token}")
        try:
            shutil.copytree(local_dir, tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a failed copy leaves nothing behind
            raise
        if os.path.isdir(path) and _exchange(tmp, path):
            shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old copy
            return
        if os.path.exists(path):  # no atomic exchange here: a moment without the folder
            os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
        return
    marker_path = f"{path.rstrip('/')}/{marker}"
    if retry(lambda: fs.exists(marker_path), f"check {url}"):
        retry(lambda: fs.rm_file(marker_path), f"unpublish {url}")
    if retry(lambda: fs.exists(path), f"check {url}"):
        retry(lambda: fs.rm(path, recursive=True), f"clear {url}")
    upload_tree(local_dir, url, last=[marker])


def _exchange(a: str, b: str) -> bool:
    """Swap two local paths in one step (Linux's renameat2 with RENAME_EXCHANGE), so a
    reader of `b` always finds a whole folder; False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)


def backoff(delay: float) -> tenacity.wait.wait_base:
    """The pause before each retry: `delay` doubling up to RETRY_MAX_DELAY, plus a random
    part up to half of that pause, so replicas that meet one outage together do not
    retry in lock-step (and the jitter survives the cap)."""
    fixed = tenacity.wait_exponential(multiplier=delay, exp_base=2, max=RETRY_MAX_DELAY)
    return _HalfJitter(fixed)


class _HalfJitter(tenacity.wait.wait_base):
    def __init__(self, fixed: tenacity.wait.wait_base):
        self.fixed = fixed

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        pause = self.fixed(retry_state)
        return pause + random.uniform(0, pause / 2)


def retry(fn: Callable[[], T], what: str, *, missing_ok: bool = True,
          attempts: int | None = None, delay: float | None = None,
          creates: bool = False) -> T:
    """Run fn, retrying transient storage errors with jittered exponential back-off.

    FileNotFoundError and PermissionError are not transient and are raised at once
    (as StorageError with the operation named, except FileNotFoundError itself). When
    fn `creates` something, FileNotFoundError means its container is missing (a bucket:
    object stores have no folders to create) and is a StorageError too. `attempts` and
    `delay` (the first pause) override the environment's budget for this call.
    """
    attempts = attempts or int(os.environ.get("MLJOB_STORAGE_RETRIES", RETRY_ATTEMPTS))
    if delay is None:
        delay = float(os.environ.get("MLJOB_STORAGE_RETRY_DELAY", RETRY_BASE_DELAY))

    def warn(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning("storage: %s failed (%s), retry %d/%d in %.1fs", what,
                    _reason(exc) if exc else "?", state.attempt_number, attempts - 1,
                    state.upcoming_sleep)

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(attempts), wait=backoff(delay),
        retry=tenacity.retry_if_exception(_retried), before_sleep=warn, reraise=True)
    try:
        return retrying(fn)
    except FileNotFoundError as exc:
        # An OS error names its local file (a source that vanished); a backend's
        # "not found" while creating means the bucket is missing.
        if creates and exc.filename is None:
            raise StorageError(f"cannot {what}: its bucket or parent folder does not "
                               f"exist ({_reason(exc)}); create it or fix the URL") \
                from None
        raise
    except PermissionError as exc:
        raise StorageError(f"cannot {what}: permission denied ({_reason(exc)})") \
            from None
    except Exception as exc:  # storage backends raise many types
        if not _retried(exc):
            raise StorageError(f"cannot {what}: {_reason(exc)}") from None
        raise StorageError(
            f"cannot {what} after {attempts} attempts: {_reason(exc)}; "
            "check that the storage is reachable") from None


def _retried(exc: BaseException) -> bool:
    return (isinstance(exc, Exception)
            and not isinstance(exc, (FileNotFoundError, PermissionError))
            and _transient(exc))


def _reason(exc: BaseException) -> str:
    """Why an operation failed, without the local file name an OSError repeats (the
    message names the URL already)."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        return exc.strerror
    return first_line(exc, 200)


# HTTP statuses worth another try (as gcsfs and Google's client libraries see them).
_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}


def _transient(exc: Exception) -> bool:
    """Worth another try: the server was unreachable or said "later".

    Backends raise their own types (aiohttp's ClientConnectorError for a refused
    connection, gcsfs's HttpError with a status code, requests' ConnectionError), so the
    class hierarchy is matched by name rather than importing every backend.
    """
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    status = getattr(exc, "code", None) or getattr(exc, "status", None)
    if isinstance(status, int):
        return status in _TRANSIENT_STATUS
    names = " ".join(cls.__name__ for cls in type(exc).__mro__)
    if any(word in names for word in ("Timeout", "ConnectionError", "ClientOSError",
                                      "ServerDisconnected", "ClientPayloadError",
                                      "TransportError")):
        return True
    text = str(exc)
    return isinstance(exc, OSError) and any(
        word in text for word in ("Connection refused", "reset by peer", "timed out",
                                  "Cannot connect", "Service Unavailable"))


if os.environ.get("MLJOB_STORAGE_REQUEST_RETRIES"):
    from mljob import gcs_retries
    gcs_retries.cap_request_retries()


def _protocols(fs) -> tuple:
    protocol = fs.protocol
    return protocol if isinstance(protocol, tuple) else (protocol,)


__all__ = ["StorageError", "TooLargeError", "filesystem", "check_segments", "absolute_url",
           "is_local", "local_path", "join", "exists", "read_bytes", "open_input",
           "write_bytes", "makedirs", "upload_file", "download_tree", "upload_tree",
           "publish_dir", "retry", "backoff", "fsspec"]
