"""`predict publish`: a job's export becomes the next version under a base path.

The trainer writes `<job-dir>/model`; a server watching `--model-base-path BASE`
serves `BASE/<version>/`. Publishing copies the export there the way the trainer
publishes its own (`mljob.storage.publish_dir`): renamed into place locally, and on
object stores every file uploaded before the marker (`saved_model.pb`, or
`export.meta`), so a watching server never loads a half-copied version.

Two publishers into one base path at once never get the same number: each claims its
version first under `BASE/.publish-claims/` (a folder no server reads), and only the
claim's winner copies. Locally the claim is a file created with O_EXCL. On object stores
each publisher writes its own claim object `<version>.<token>` (created with the store's
"only if absent" precondition where the backend has one: gcsfs sends
`ifGenerationMatch=0`) and then lists the claims of that number: the earliest (by the
store's generation or creation time, then name) wins, and every publisher sees the same
order, since a claim written after another's listing is later than every claim that
listing saw. The loser takes the next number; a number given with --version that is
taken is refused. A claim is kept after publishing (versions are never reused), and
released when the copy fails.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid

from mljob import contracts, storage
from mljob.errors import ascii_digits
from predict.errors import UsageError
from predict.models.versions import MARKERS, MAX_VERSION, scan_versions

CLAIMS = ".publish-claims"
MAX_ATTEMPTS = 100  # numbers tried before giving up (each taken by a concurrent publisher)


def publish(model_dir: str, base_path: str, version: int | None = None, *,
            warmup_requests: str | None = None) -> int:
    """Copy the export at model_dir to base_path/<version> (default: the highest
    version there, or claimed there, plus one); returns the version. `warmup_requests`:
    a TFRecord file of PredictionLog records, checked and published as the version's
    assets.extra/tf_serving_warmup_requests (TF Serving's warmup file)."""
    if version is not None and not 1 <= version <= MAX_VERSION:
        raise UsageError(f"--version {version} is outside 1 to {MAX_VERSION}; versions "
                         "are int64, as TF Serving's are")
    fs, base = storage.filesystem(base_path)  # an empty file:// or a control character
    if storage.retry(lambda: fs.isfile(base), f"check {base_path}"):
        raise UsageError(f"--model-base-path {base_path} is a file; give the folder a "
                         "server watches (BASE/<version>/ is written under it)")
    scratch = None
    warmup_data = None
    if warmup_requests is not None:
        from predict.models import warmup
        warmup_data = warmup.check_file(warmup_requests)
    try:
        local = _local_export(model_dir)
        if not storage.is_local(model_dir):
            scratch = local
        for rel, target in storage.links_leaving(local):
            raise UsageError(f"{model_dir} holds the link {rel} -> {target}, which leads "
                             "out of the export; copy what it names into the export (or "
                             "remove the link): nothing is published")
        marker = next((m for m in MARKERS if os.path.isfile(os.path.join(local, m))), None)
        if marker is None:
            raise UsageError(f"{model_dir} holds no export: looked for "
                             f"{contracts.SAVED_MODEL_MARKER} and "
                             f"{contracts.LEGACY_EXPORT_MARKER}")
        if warmup_data is not None:
            from predict.models import warmup
            if scratch is None:  # never write into the user's own export
                scratch = tempfile.mkdtemp(prefix="mljob-publish-")
                shutil.copytree(local, os.path.join(scratch, "export"))
                local = os.path.join(scratch, "export")
            target = os.path.join(local, warmup.WARMUP_FILE)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(warmup_data)
        version, claim = _claim_version(base_path, version)
        try:
            storage.publish_dir(local, storage.join(base_path, str(version)), marker=marker)
        except BaseException:
            _release(base_path, claim)
            raise
        return version
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _local_export(model_dir: str) -> str:
    missing = UsageError(f"model dir {model_dir} does not exist; pass the export folder "
                         "(<job-dir>/model)")
    if storage.is_local(model_dir):
        local = storage.local_path(model_dir)
        if not os.path.isdir(local):
            raise missing
        return local
    scratch = tempfile.mkdtemp(prefix="mljob-publish-")
    try:
        storage.download_tree(model_dir, scratch)
    except FileNotFoundError:
        shutil.rmtree(scratch, ignore_errors=True)
        raise missing from None
    return scratch


def _claim_version(base_path: str, version: int | None) -> tuple[int, str]:
    """(version, claim name): the given version, or the next free one, claimed."""
    try:
        existing = set(scan_versions(base_path))
    except FileNotFoundError:
        existing = set()
    if version is not None:
        if version in existing or storage.exists(storage.join(base_path, str(version))):
            raise UsageError(f"{base_path} already has version {version}; publish under "
                             "a new number (versions are never overwritten)")
        claim = _claim(base_path, version)
        if claim is None:
            raise UsageError(f"{base_path}: version {version} is being published by "
                             "another publisher; publish under a new number")
        return version, claim
    candidate = max(existing | _claimed(base_path), default=0) + 1
    for _ in range(MAX_ATTEMPTS):
        if candidate > MAX_VERSION:
            break
        if not storage.exists(storage.join(base_path, str(candidate))):
            claim = _claim(base_path, candidate)
            if claim is not None:
                return candidate, claim
        candidate += 1
    raise UsageError(f"{base_path}: no free version number after {MAX_ATTEMPTS} tries "
                     f"up to {candidate}; give one with --version")


def _claims_url(base_path: str) -> str:
    return storage.join(base_path, CLAIMS)


def _claimed(base_path: str) -> set[int]:
    fs, root = storage.filesystem(_claims_url(base_path))
    try:
        fs.invalidate_cache(root)
        names = [e.rstrip("/").rsplit("/", 1)[-1] for e in
                 storage.retry(lambda: fs.ls(root, detail=False), f"list {base_path}")]
    except FileNotFoundError:
        return set()
    numbers = {n.split(".", 1)[0] for n in names}
    return {int(n) for n in numbers if ascii_digits(n) and len(n) <= 19
            and int(n) <= MAX_VERSION}


def _claim(base_path: str, version: int) -> str | None:
    """The claim's name when this publisher won `version`, None when another did."""
    fs, root = storage.filesystem(_claims_url(base_path))
    if storage.is_local(base_path):
        os.makedirs(root, exist_ok=True)
        try:
            os.close(os.open(os.path.join(root, str(version)),
                             os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            return None
        return str(version)
    name = f"{version}.{uuid.uuid4().hex}"

    def write():
        try:
            fs.pipe_file(f"{root}/{name}", b"", mode="create")
        except TypeError:  # a backend without create mode: the name is ours alone anyway
            fs.pipe_file(f"{root}/{name}", b"")
    try:
        storage.retry(write, f"claim version {version} in {base_path}", creates=True)
    except FileExistsError:  # the precondition held against a name of our own: cannot be
        return None
    fs.invalidate_cache(root)
    entries = storage.retry(lambda: fs.ls(root, detail=True), f"list {base_path}")
    mine = [e for e in entries if e["name"].rstrip("/").rsplit("/", 1)[-1]
            .split(".", 1)[0] == str(version)]
    first = min(mine, key=_order)["name"].rstrip("/").rsplit("/", 1)[-1]
    if first != name:
        _release(base_path, name)
        return None
    return name


def _order(entry: dict) -> tuple:
    """A claim's place: the store's generation (gs://) or creation time, then its name."""
    generation = entry.get("generation")
    when = int(generation) if isinstance(generation, (int, str)) and \
        ascii_digits(str(generation)) else entry.get("created") or 0
    if not isinstance(when, (int, float)):
        when = 0
    return when, entry["name"]


def _release(base_path: str, claim: str) -> None:
    fs, root = storage.filesystem(_claims_url(base_path))
    try:
        fs.rm_file(f"{root}/{claim}")
    except (OSError, storage.StorageError):
        pass  # a claim left behind only burns its number


__all__ = ["publish"]
