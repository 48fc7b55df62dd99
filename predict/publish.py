"""`predict publish`: a job's export becomes the next version under a base path.

The trainer writes `<job-dir>/model`; a server watching `--model-base-path BASE`
serves `BASE/<version>/`. Publishing copies the export there the way the trainer
publishes its own (`mljob.storage.publish_dir`): renamed into place locally, and on
object stores every file uploaded before the marker (`saved_model.pb`, or
`export.meta`), so a watching server never loads a half-copied version.
"""
from __future__ import annotations

import os
import shutil
import tempfile

from mljob import contracts, storage
from predict.errors import UsageError
from predict.repository import MARKERS, scan_versions


def publish(model_dir: str, base_path: str, version: int | None = None, *,
            warmup_requests: str | None = None) -> int:
    """Copy the export at model_dir to base_path/<version> (default: the highest
    version there plus one); returns the version. `warmup_requests`: a TFRecord file of
    PredictionLog records, checked and published as the version's
    assets.extra/tf_serving_warmup_requests (TF Serving's warmup file)."""
    scratch = None
    warmup_data = None
    if warmup_requests is not None:
        from predict import warmup
        warmup_data = warmup.check_file(warmup_requests)
    try:
        if storage.is_local(model_dir):
            local = storage.local_path(model_dir)
            if not os.path.isdir(local):
                raise UsageError(f"model dir {model_dir} does not exist; pass the export "
                                 "folder (<job-dir>/model)")
        else:
            scratch = local = tempfile.mkdtemp(prefix="mljob-publish-")
            try:
                storage.download_tree(model_dir, local)
            except FileNotFoundError:
                raise UsageError(f"model dir {model_dir} does not exist; pass the export "
                                 "folder (<job-dir>/model)") from None
        marker = next((m for m in MARKERS if os.path.isfile(os.path.join(local, m))), None)
        if marker is None:
            raise UsageError(f"{model_dir} holds no export: looked for "
                             f"{contracts.SAVED_MODEL_MARKER} and "
                             f"{contracts.LEGACY_EXPORT_MARKER}")
        if warmup_data is not None:
            from predict import warmup
            if scratch is None:  # never write into the user's own export
                scratch = tempfile.mkdtemp(prefix="mljob-publish-")
                shutil.copytree(local, os.path.join(scratch, "export"))
                local = os.path.join(scratch, "export")
            target = os.path.join(local, warmup.WARMUP_FILE)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(warmup_data)
        try:
            existing = scan_versions(base_path)
        except FileNotFoundError:
            existing = {}
        if version is None:
            version = max(existing, default=0) + 1
        elif version in existing or storage.exists(storage.join(base_path, str(version))):
            raise UsageError(f"{base_path} already has version {version}; publish under "
                             "a new number (versions are never overwritten)")
        storage.publish_dir(local, storage.join(base_path, str(version)), marker=marker)
        return version
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


__all__ = ["publish"]
