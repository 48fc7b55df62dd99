"""Keras's callbacks under a MultiWorkerMirroredStrategy over several tasks, as the
TensorFlow tutorial "Multi-worker training with Keras" says they behave.

Every worker runs every callback (a save reads variables, which may take a collective
that all workers must join), in the order given, then Keras's History:

- `ModelCheckpoint`, `TensorBoard`, `CSVLogger`: the chief writes where the user said;
  the other workers write into a temporary folder deleted when `fit` returns;
- `BackupAndRestore`: every worker restores from the chief's backup (so all start at
  the same epoch with the same weights); the chief writes the backups, the others write
  theirs into the temporary folder;
- `stop_training`: after every epoch (and after every batch when a callback acts on
  batches) the workers all-reduce their flags, so an `EarlyStopping` (or a
  `TerminateOnNaN`) that stops one stops all at the same point; a worker leaving the
  loop alone would leave the others waiting in a collective;
- everything else (EarlyStopping, ReduceLROnPlateau, LearningRateScheduler, the user's
  own) runs on every worker on the same logs: they are reduced over all workers, so each
  worker's callback takes the same decision.
"""
from __future__ import annotations

import os

import keras
import tensorflow as tf

Callback = keras.callbacks.Callback  # the base of those below


def is_chief(strategy) -> bool:
    """The chief, else worker 0 when the cluster has no chief (TensorFlow's rule)."""
    resolver = strategy.cluster_resolver
    spec = resolver.cluster_spec().as_dict()
    if resolver.task_type == "chief":
        return True
    return resolver.task_type == "worker" and int(resolver.task_id or 0) == 0 \
        and not spec.get("chief")


def placed(callbacks, strategy, scratch: str | None) -> list:
    """The user's callbacks (a list, or a CallbackList's), with their writes sent to
    `scratch` on a worker that is not the chief (scratch None: the chief), and the
    agreement on `stop_training` last."""
    if isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = callbacks.callbacks
    given = list(keras.tree.flatten(callbacks)) if callbacks else []
    out = []
    for callback in given:
        out.append(callback)
        if scratch is None:
            continue
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            # restore from the chief's backup (the callback's own on_train_begin), then
            # write this worker's own backups to the scratch folder
            out.append(_BackupHere(callback, os.path.join(scratch, "backup")))
        elif isinstance(callback, keras.callbacks.ModelCheckpoint):
            callback.filepath = _in(scratch, "checkpoints", callback.filepath)
        elif isinstance(callback, keras.callbacks.TensorBoard):
            callback.log_dir = os.path.join(scratch, "tensorboard")
        elif isinstance(callback, keras.callbacks.CSVLogger):
            callback.filename = _in(scratch, "csv", callback.filename)
    by_batch = any(_acts_on_batches(c) for c in given)
    out.append(AgreedStopByBatch(strategy) if by_batch else AgreedStop(strategy))
    return out


def _in(scratch: str, kind: str, path) -> str:
    folder = os.path.join(scratch, kind)
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, os.path.basename(str(path).rstrip("/")) or kind)


def _acts_on_batches(callback) -> bool:
    return any(getattr(type(callback), hook) is not getattr(Callback, hook)
               for hook in ("on_train_batch_end", "on_batch_end"))


class _BackupHere(keras.callbacks.Callback):
    """After a BackupAndRestore restored from the chief's folder, point it at this
    worker's own (its constructor's arguments, kept)."""

    def __init__(self, backup, folder: str):
        super().__init__()
        self.backup, self.folder = backup, folder

    def on_train_begin(self, logs=None):
        b = self.backup
        model, params = b.model, b.params
        b.__init__(self.folder, save_freq=b.save_freq, double_checkpoint=b.double_checkpoint,
                   delete_checkpoint=True)
        b.set_model(model)
        b.set_params(params)


class AnyWorker:
    """flag -> whether any worker's flag is set: an all-reduce every worker joins, so
    every worker calls it at the same point."""

    def __init__(self, strategy):
        self.strategy = strategy
        self._sum = None

    def __call__(self, flag: bool) -> bool:
        if self._sum is None:
            self._sum = tf.function(self._all_workers_sum, autograph=False)
        return float(self._sum(tf.constant(1.0 if flag else 0.0))) > 0

    def _all_workers_sum(self, flag):
        def replica(value):
            return tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, tf.identity(value))
        total = self.strategy.run(replica, args=(flag,))
        return self.strategy.experimental_local_results(total)[0]


class AgreedStop(keras.callbacks.Callback):
    """`model.stop_training` made the same on every worker after each epoch: set when
    any worker's callbacks set it."""

    def __init__(self, strategy):
        super().__init__()
        self.strategy = strategy
        self._any = AnyWorker(strategy)

    def on_epoch_end(self, epoch, logs=None):
        self.agree()

    def agree(self) -> None:
        self.model.stop_training = self._any(bool(self.model.stop_training))


class AgreedStopByBatch(AgreedStop):
    """AgreedStop after every batch too (a callback acting on batches may stop there)."""

    def on_train_batch_end(self, batch, logs=None):
        self.agree()


__all__ = ["is_chief", "placed", "AnyWorker", "AgreedStop", "AgreedStopByBatch"]
