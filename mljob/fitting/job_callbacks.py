"""What `mljob.training` gives a job, as Keras callbacks run after the user's in the
epoch mode (`mljob.fitting.library`), at epoch grain on every strategy (parameter
servers run callbacks once an epoch; none of these has a batch-level method):

- `JobReport`: the progress lines the launcher reads (`training started`, a
  `step N/M loss=...` line per epoch where N is the epochs done times
  `steps_per_epoch`, an `eval step=N ...` line per validation, `training finished`),
  the TensorBoard scalars under the job's summary folder (`train/` and `eval/`, the
  step mode's tags: `metrics/loss`, `metrics/<metric>`, `optimizer/learning_rate`,
  `speed/...`), and the hypertune report (each validation's, else the last epoch's
  training logs at the end); the chief writes, the other replicas print nothing;
- `EpochCheckpoints`: the model's weights and step in mljob's checkpoints (atomic,
  `<job-dir>/checkpoints/ckpt-N`) at each epoch's end, which an evaluator replica
  follows; every synchronous worker takes part, the chief writes;
- `BackupUpload`: a remote job dir's backup (`gs://...`): Keras's `BackupAndRestore`
  writes a local folder, uploaded after each epoch and fetched before training;
- `StopOnSignal`: SIGTERM (SIGINT, the launcher's death) stops training at the end of
  the epoch in progress, once that epoch's backup is saved (`BackupAndRestore`,
  before it in the list), agreed by every synchronous worker; the run then ends with
  exit status 143.
"""
from __future__ import annotations

import math
import time

import keras
import tensorflow as tf

from mljob import hypertune, storage
from mljob.training import model_optimizers
from mljob.training.checkpoints import CheckpointStore
from mljob.training.keras_private import initial_epoch
from mljob.training.signals import StopSignal
from mljob.training.summaries import NO_LOSS, Progress, SummaryWriters

VALIDATION = "val_"
BACKUP_EPOCH_FILE = "training_metadata.json"  # BackupAndRestore's epoch (Keras 3)


def scalars(logs) -> dict[str, float]:
    """An epoch's logs as floats, learning_rate (the rate callbacks log) left out."""
    out = {}
    for name, value in (logs or {}).items():
        if name == "learning_rate":
            continue
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def split(logs: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """(training logs, validation logs without their `val_`)."""
    train = {k: v for k, v in logs.items() if not k.startswith(VALIDATION)}
    val = {k[len(VALIDATION):]: v for k, v in logs.items() if k.startswith(VALIDATION)}
    return train, val


class JobReport(keras.callbacks.Callback):
    """The job's lines, summaries and hypertune report (module doc)."""

    def __init__(self, progress: Progress, writers: SummaryWriters, *, started: str,
                 steps_per_epoch: int, batch_size: int, own_steps: bool):
        super().__init__()
        self.progress, self.writers, self.started = progress, writers, started
        self.steps_per_epoch, self.batch_size = steps_per_epoch, batch_size
        self.own_steps = own_steps
        self.last: dict[str, float] = {}
        self.validated = False
        self.epochs_done = 0
        self._epoch_begun = time.monotonic()
        self._trained: float | None = None  # when the epoch's training steps ended
        self._rate: float | dict[str, float] = float("nan")

    def on_train_begin(self, logs=None):
        start = initial_epoch(self.model) or self.params.get("initial_epoch", 0) or 0
        self.epochs_done = start
        self.progress.line(self.started.format(epoch=start,
                                               step=start * self.steps_per_epoch))

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_begun, self._trained = time.monotonic(), None
        # the rate the epoch trains at: the user's callbacks (a scheduler) set it before
        # this one, a plateau's halving at the epoch's end is the next epoch's
        self._rate = self.learning_rate()

    def on_test_begin(self, logs=None):
        if self._trained is None:  # the epoch's validation: its steps are done
            self._trained = time.monotonic()

    def on_epoch_end(self, epoch, logs=None):
        step = (epoch + 1) * self.steps_per_epoch
        self.epochs_done = epoch + 1
        train, val = split(scalars(logs))
        self.last = dict(train)
        trained, self._trained = self._trained or time.monotonic(), None
        seconds = max(trained - self._epoch_begun, 1e-9)
        steps_per_sec = self.steps_per_epoch / seconds
        examples = steps_per_sec * self.batch_size
        loss = train.pop("loss", NO_LOSS)
        rate = self._rate
        self.progress.step(step, loss, train, examples, rate)
        rates = rate if isinstance(rate, dict) else {"learning_rate": rate}
        self.writers.train(step, loss=loss, **train, **rates, steps_per_sec=steps_per_sec,
                           examples_per_sec=examples)
        if val:
            self.validated = True
            val_loss = val.pop("loss", NO_LOSS)
            self.progress.eval(step, val_loss, val)
            self.writers.eval(step, loss=val_loss, **val)
            if self.progress.enabled:
                hypertune.report_evaluation(step, loss=val_loss, metrics=val)
        self.writers.sync()

    def on_train_end(self, logs=None):
        step = self.epochs_done * self.steps_per_epoch
        if not self.validated and self.last and self.progress.enabled:
            last = dict(self.last)
            hypertune.report_evaluation(step, loss=last.pop("loss", math.nan), metrics=last)
        self.writers.sync()

    def learning_rate(self):
        """The rate of the model's optimizer; of each its own step applies, by
        attribute, when it holds several (a GAN's)."""
        used = model_optimizers.named(self.model)
        if self.own_steps and len(used) > 1:
            used = [(n, o) for n, o in used if n != "optimizer"] or used
            return {f"{name}_lr": model_optimizers.learning_rate(o) for name, o in used}
        return model_optimizers.learning_rate(self.model.optimizer) if used \
            else float("nan")


class EpochCheckpoints(keras.callbacks.Callback):
    """The model's weights and step, in mljob's checkpoints, each epoch (module doc)."""

    def __init__(self, store: CheckpointStore, steps_per_epoch: int):
        super().__init__()
        self.store, self.steps_per_epoch = store, steps_per_epoch
        self._checkpoint = None
        self._step = None

    def on_epoch_end(self, epoch, logs=None):
        if self._checkpoint is None:
            self._step = tf.Variable(0, dtype=tf.int64, trainable=False)
            self._checkpoint = tf.train.Checkpoint(
                model={w.path: w.value for w in self.model.weights}, step=self._step)
        step = (epoch + 1) * self.steps_per_epoch
        self._step.assign(step)
        self.store.save(self._checkpoint, step)


class BackupUpload(keras.callbacks.Callback):
    """After BackupAndRestore saved an epoch into a local folder, upload that folder to
    the job's remote backup (Keras writes its backups to local paths only here);
    `download` fetches it before training. The chief uploads, the others do nothing."""

    def __init__(self, local: str, url: str, *, enabled: bool):
        super().__init__()
        self.local, self.url, self.enabled = local, url, enabled

    def download(self) -> None:
        try:
            storage.download_tree(self.url, self.local)
        except FileNotFoundError:
            pass  # no backup yet: the job starts at its first epoch

    def on_epoch_end(self, epoch, logs=None):
        if self.enabled:  # the epoch's number last: a reader sees the weights first
            storage.upload_tree(self.local, self.url, last=[BACKUP_EPOCH_FILE])


class StopOnSignal(keras.callbacks.Callback):
    """stop_training at an epoch's end once a stop was requested (module doc); with
    `agree` (synchronous workers: `mirrored_callbacks.AnyWorker`) once any worker's
    was, so that every worker stops, and ends 143, after the same epoch."""

    def __init__(self, stop: StopSignal, agree=None):
        super().__init__()
        self.stop, self.agree = stop, agree
        self.stopped_after: int | None = None

    def on_epoch_end(self, epoch, logs=None):
        requested = self.stop.requested()
        if self.agree is not None:
            requested = self.agree(requested)
        if requested:
            self.model.stop_training = True
            self.stopped_after = epoch


__all__ = ["JobReport", "EpochCheckpoints", "BackupUpload", "StopOnSignal", "scalars",
           "split"]
