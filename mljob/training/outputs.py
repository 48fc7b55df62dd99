"""Where a run's outputs go, resolved once from the job dir and the environment.

Under the job dir (`--job-dir`), except that Vertex AI's AIP_MODEL_DIR,
AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR, when set, take the export, the
checkpoints and the summaries (Vertex AI sets them to `<baseOutputDirectory>/model/`,
`/checkpoints/` and `/logs/`). No TensorFlow here.
"""
from __future__ import annotations

import dataclasses
import datetime
import os

from mljob import storage
from mljob.contracts import AIP_CHECKPOINT_DIR, AIP_MODEL_DIR, AIP_TENSORBOARD_LOG_DIR
from mljob.training.errors import UsageError

DEFAULT_JOBS_DIR = "jobs"


@dataclasses.dataclass(frozen=True)
class Outputs:
    """Where this job's outputs go, resolved once from --job-dir and the environment."""

    job_dir: str
    export_url: str        # the SavedModel: AIP_MODEL_DIR or <job-dir>/model
    checkpoint_url: str    # AIP_CHECKPOINT_DIR or <job-dir>/checkpoints
    summary_url: str       # AIP_TENSORBOARD_LOG_DIR or <job-dir>/summaries (train/, eval/)
    from_environment: tuple[str, ...] = ()  # the AIP_* variables in effect

    def describe(self) -> str:
        return (f"outputs: model={self.export_url} checkpoints={self.checkpoint_url} "
                f"summaries={self.summary_url} (from {', '.join(self.from_environment)})")


def resolve_outputs(job_dir: str | None, environ) -> Outputs:
    """--job-dir and the AIP_* variables, checked; a bad URL is a UsageError naming it.

    Without --job-dir the job dir is the parent of AIP_MODEL_DIR when that is set (where
    Vertex AI's base output directory is), else jobs/trainer-<UTC time>."""
    aip = {}
    for name in (AIP_MODEL_DIR, AIP_CHECKPOINT_DIR, AIP_TENSORBOARD_LOG_DIR):
        value = (environ.get(name) or "").strip()
        if value:
            aip[name] = _checked_url(_without_slash(value), name)
    if job_dir is None and AIP_MODEL_DIR in aip:
        job_dir = _parent(aip[AIP_MODEL_DIR])
    elif job_dir is None:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d_%H%M%S")
        job_dir = os.path.join(DEFAULT_JOBS_DIR, f"trainer-{stamp}")
    _checked_url(job_dir, "--job-dir")
    return Outputs(
        job_dir=job_dir,
        export_url=aip.get(AIP_MODEL_DIR) or storage.join(job_dir, "model"),
        checkpoint_url=aip.get(AIP_CHECKPOINT_DIR) or storage.join(job_dir, "checkpoints"),
        summary_url=aip.get(AIP_TENSORBOARD_LOG_DIR) or storage.join(job_dir, "summaries"),
        from_environment=tuple(aip))


def _checked_url(url: str, name: str) -> str:
    try:
        storage.filesystem(url)
    except storage.StorageError as exc:
        raise UsageError(f"{name}: {exc}") from None
    return url


def _without_slash(url: str) -> str:
    """Vertex AI's values end in '/'; joins and the job record want none."""
    stripped = url.rstrip("/")
    return stripped if stripped and not stripped.endswith(":") else url


def _parent(url: str) -> str:
    scheme, sep, path = url.rpartition("://")
    head = path.rpartition("/")[0]
    if not head:
        raise UsageError(f"{AIP_MODEL_DIR} {url!r} has no parent folder to use as the job "
                         "dir; give --job-dir")
    return f"{scheme}{sep}{head}"


__all__ = ["Outputs", "resolve_outputs", "DEFAULT_JOBS_DIR"]
