"""A batch prediction job's output path: claimed by one job, never another's overwritten.

Before any shard is written the job claims the path with a marker, `.mljob-job.json`
(its job id); Cloud ML's readers glob `prediction.results-*` and never see it. A path
holding another job's marker, or predictions with no marker, is refused in one line;
the job's own output is taken only with `--resume`, which skips the shards published.
"""
from __future__ import annotations

import json
import os
import time

from mljob import storage
from submit.errors import UsageError

MARKER = ".mljob-job.json"


def read_marker(output_path: str) -> dict | None:
    url = storage.join(output_path, MARKER)
    if not storage.exists(url):
        return None
    try:
        data = json.loads(storage.read_bytes(url, limit=1 << 16))
        return data if isinstance(data, dict) else {}
    except (ValueError, storage.StorageError):
        return {}


def check_output(output_path: str, job_id: str, resume: bool) -> None:
    """Refuse an output path this job may not write: a file, another job's predictions,
    or predictions nobody claimed (without --resume, this job's own are refused too)."""
    fs, path = storage.filesystem(output_path)
    if storage.retry(lambda: fs.isfile(path), f"check {output_path}"):
        raise UsageError(f"--output-path {output_path} is a file; batch prediction writes "
                         "a folder of results, name a new or empty folder")
    marker = read_marker(output_path)
    owner = (marker or {}).get("jobId")
    if marker is not None and owner != job_id:
        raise UsageError(f"--output-path {output_path} holds the output of job "
                         f"{str(owner)[:60]!r}; choose another --output-path (another "
                         "job's files are never overwritten)")
    try:
        existing = storage.retry(lambda: fs.glob(f"{path.rstrip('/')}/prediction.*"),
                                 f"list {output_path}")
    except FileNotFoundError:
        existing = []
    if existing and marker is None:
        raise UsageError(f"--output-path {output_path} already holds predictions "
                         f"({os.path.basename(existing[0])}) of no job of ours; choose "
                         "an empty --output-path")
    if marker is not None and not resume:
        raise UsageError(f"--output-path {output_path} holds job {job_id}'s output; pass "
                         "--resume to finish that job, or choose another --output-path")


def claim_output(output_path: str, job_id: str) -> None:
    """Write the marker naming this job (exclusively, for a local path)."""
    data = json.dumps({"jobId": job_id, "createTime": time.time()}).encode()
    if storage.is_local(output_path):
        folder = storage.local_path(output_path)
        os.makedirs(folder, exist_ok=True)
        try:
            fd = os.open(os.path.join(folder, MARKER), os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                         0o644)
        except FileExistsError:
            owner = (read_marker(output_path) or {}).get("jobId")
            if owner != job_id:
                raise UsageError(f"--output-path {output_path} was just claimed by job "
                                 f"{str(owner)[:60]!r}; choose another --output-path") \
                    from None
            return
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return
    if read_marker(output_path) is None:
        storage.write_bytes(storage.join(output_path, MARKER), data)


def count_lines(url: str) -> int:
    with storage.open_input(url) as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
