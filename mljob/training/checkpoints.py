"""Checkpoints in `<job-dir>/checkpoints/` (or Vertex AI's AIP_CHECKPOINT_DIR), on any
fsspec URL.

Layout (TensorFlow's own, so `tf.train.latest_checkpoint` and TensorBoard read it):
`ckpt-<step>.index`, `ckpt-<step>.data-00000-of-00001` and the `checkpoint` state file
naming the newest and the kept checkpoints with relative paths.

Writing order makes every state a reader can see consistent:
1. the data files, then the index (a checkpoint "exists" once its index does);
2. the `checkpoint` state file, replaced whole (atomically for local paths);
3. only then are checkpoints beyond the newest `keep` deleted.

TensorFlow writes only local paths here, so checkpoints are written into a local scratch
folder and published with `mljob.storage`; for a local job dir TensorFlow writes in
place (it writes each file under a temporary name and renames it).

Restore tries checkpoints newest to oldest (by the step in their name, found by listing
the index files, so a lost or stale state file does not matter) and falls back past one
that cannot be read (truncated, corrupt, half-deleted), with a warning.
"""
from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import tempfile

import tensorflow as tf

from mljob import contracts, storage
from mljob.errors import first_line

log = logging.getLogger(__name__)

PREFIX = "ckpt"
STATE_FILE = contracts.CHECKPOINT_STATE
_INDEX = re.compile(rf"{PREFIX}-([0-9]+)\.index")  # fullmatch


class CheckpointStore:
    """The job's checkpoints. `writer` is True on the chief only: other replicas that
    must take part in a save (MultiWorkerMirroredStrategy) write to a temp dir instead."""

    def __init__(self, url: str, *, keep: int, writer: bool):
        self.url = url  # the checkpoints folder itself (TrainConfig.checkpoint_url)
        self.keep = max(1, keep)
        self.writer = writer
        self.in_place = writer and storage.is_local(self.url)
        self._scratch = tempfile.mkdtemp(prefix="mljob-ckpt-")

    def close(self) -> None:
        shutil.rmtree(self._scratch, ignore_errors=True)

    # ---- reading -------------------------------------------------------------------

    def steps(self) -> list[int]:
        """Steps of the checkpoints whose index file exists, newest first."""
        fs, root = storage.filesystem(self.url)
        try:
            names = storage.retry(lambda: fs.ls(root, detail=False), f"list {self.url}")
        except FileNotFoundError:
            return []
        steps = []
        for name in names:
            match = _INDEX.fullmatch(os.path.basename(name.rstrip("/")))
            if match:
                steps.append(int(match.group(1)))
        return sorted(steps, reverse=True)

    def latest_published_step(self) -> int | None:
        """The step the `checkpoint` state file names (what the evaluator follows)."""
        try:
            text = storage.read_bytes(storage.join(self.url, STATE_FILE)).decode()
        except FileNotFoundError:
            return None
        match = re.search(rf'^model_checkpoint_path:\s*"{PREFIX}-([0-9]+)"', text, re.M)
        return int(match.group(1)) if match else None

    def local_prefix(self, step: int) -> str:
        """A local path prefix for checkpoint `step`, downloading it when remote."""
        name = f"{PREFIX}-{step}"
        if storage.is_local(self.url):
            return os.path.join(storage.local_path(self.url), name)
        target = os.path.join(self._scratch, "restore", str(step))
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(target)
        fs, root = storage.filesystem(self.url)
        files = storage.retry(lambda: fs.glob(f"{root.rstrip('/')}/{name}.*"),
                              f"list {self.url}")
        for remote in files:
            local = os.path.join(target, os.path.basename(remote))
            storage.retry(functools.partial(fs.get_file, remote, local), f"download {remote}")
        return os.path.join(target, name)

    def restore(self, checkpoint: tf.train.Checkpoint, *, partial: bool = False) -> int | None:
        """Restore the newest readable checkpoint; its step, or None when there is none.

        partial allows a checkpoint holding more than `checkpoint` asks for (the
        evaluator restores the model only)."""
        for step in self.steps():
            try:
                prefix = self.local_prefix(step)
                status = checkpoint.read(prefix)
                if partial:
                    status.expect_partial()
                else:
                    status.assert_existing_objects_matched()
                return step
            except storage.StorageError:
                raise  # storage is down, not the checkpoint: do not start over from 0
            except Exception as exc:
                # IndexError ("Read less bytes than requested"), ValueError, AssertionError
                log.warning("checkpoint %s/%s-%d cannot be read (%s); trying the "
                            "previous one", self.url, PREFIX, step, first_line(exc, 200))
                print(f"warning: checkpoint {PREFIX}-{step} cannot be read "
                      f"({first_line(exc, 200)}); trying the previous one", flush=True)
        return None

    # ---- writing -------------------------------------------------------------------

    def save(self, checkpoint: tf.train.Checkpoint, step: int) -> str | None:
        """Write checkpoint `step` and publish it; non-writers write and delete a copy.
        Returns the checkpoint's URL prefix on the writer."""
        name = f"{PREFIX}-{step}"
        if not self.writer:
            tmp = tempfile.mkdtemp(prefix="mljob-ckpt-peer-")
            try:
                checkpoint.write(os.path.join(tmp, name))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            return None
        if self.in_place:
            directory = storage.local_path(self.url)
            os.makedirs(directory, exist_ok=True)
            checkpoint.write(os.path.join(directory, name))
        else:
            staging = os.path.join(self._scratch, "save", str(step))
            shutil.rmtree(staging, ignore_errors=True)
            os.makedirs(staging)
            checkpoint.write(os.path.join(staging, name))
            storage.makedirs(self.url)
            storage.upload_tree(staging, self.url, last=[f"{name}.index"])
            shutil.rmtree(staging, ignore_errors=True)
        kept = sorted(set(self.steps()) | {step}, reverse=True)
        kept = [s for s in kept if s <= step][:self.keep]
        storage.write_bytes(storage.join(self.url, STATE_FILE), _state_text(kept).encode())
        # Newer checkpoints than this one exist only when restore fell back past them
        # (unreadable): drop them with the old ones, so the state file and the listing agree.
        self._prune(keep=set(kept))
        return storage.join(self.url, name)

    def _prune(self, keep: set[int]) -> None:
        fs, root = storage.filesystem(self.url)
        try:
            names = storage.retry(lambda: fs.ls(root, detail=False), f"list {self.url}")
        except FileNotFoundError:
            return
        pattern = re.compile(rf"^{PREFIX}-([0-9]+)\.")
        for path in names:
            match = pattern.match(os.path.basename(path.rstrip("/")))
            if match and int(match.group(1)) not in keep:
                try:
                    storage.retry(functools.partial(fs.rm, path, recursive=True),
                                  f"delete {path}")
                except (FileNotFoundError, storage.StorageError) as exc:
                    log.warning("could not delete old checkpoint file %s: %s", path, exc)


def finalize(optimizer, model) -> None:
    """What Keras's `fit` does when its last epoch ends, before the final checkpoint and
    the export: `optimizer.finalize_variable_values(model.trainable_weights)`, which for
    an optimizer with `use_ema=True` writes the moving averages into the model (a no-op
    for every other optimizer). So the final checkpoint and the export hold the model
    `fit` would have left."""
    optimizer.finalize_variable_values(model.trainable_weights)


def seed_states(model) -> dict:
    """The state of each of the model's random seed generators (Dropout's, a GAN's
    noise), by position and path: a resumed run draws what the uninterrupted one would
    have drawn next, not the first steps' masks again. Keras's `variables` are its
    `weights` and these (a path can repeat: each Dropout's is `seed_generator/...`)."""
    weights = {id(w) for w in model.weights}
    return {f"{i}:{v.path}": v.value for i, v in enumerate(
        v for v in model.variables if id(v) not in weights)}


def _state_text(steps_newest_first: list[int]) -> str:
    """TensorFlow's CheckpointState text format, relative paths, oldest listed first."""
    lines = [f'model_checkpoint_path: "{PREFIX}-{steps_newest_first[0]}"']
    lines += [f'all_model_checkpoint_paths: "{PREFIX}-{s}"'
              for s in reversed(steps_newest_first)]
    return "\n".join(lines) + "\n"



__all__ = ["CheckpointStore", "PREFIX", "STATE_FILE", "finalize", "seed_states"]
