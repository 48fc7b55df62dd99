"""Keras's `model.fit` under ParameterServerStrategy, where Keras 3's does not run
(keras-team/keras#18624): the coordinator (the chief) runs the loop and Keras's own
callbacks, as tf.keras 2's `fit` did under ParameterServerStrategy.

In the user's script (TensorFlow's tutorial "Parameter server training", its
`model.fit` part) the workers and parameter servers run `tf.distribute.Server(...)
.join()`; the chief builds the strategy, builds and compiles the model in
`strategy.scope()`, and calls `fit`:

- `x`: a `tf.data.Dataset` or a function of a `tf.distribute.InputContext`, each
  worker's input pipeline (`ps_inputs`), `steps_per_epoch` required (one line
  otherwise, as tf.keras 2 required it); or arrays (`y`, `sample_weight`,
  `validation_split`, `batch_size`, `shuffle` as Keras takes them), each worker's
  pipeline made from them, `steps_per_epoch` by default Keras's (`ps_arrays`);
- each step is mljob's parameter-server step, the one the equivalence suite checks
  against Keras's `fit` on one node (`mljob.training.loop.Replica`: Keras's losses and
  metrics as compile resolved them, every optimizer option, the layers' state and the
  step count added on the ps, local steps for plain Adam), scheduled on the workers in
  chunks of `steps_per_execution` that never cross an epoch's end;
- at each epoch's end the coordinator waits for every scheduled step, merges the
  chunks' metric states into the epoch's logs (as Keras accumulates its metrics over an
  epoch), evaluates `validation_data` itself (`val_` logs, every `validation_freq`
  epochs) and runs the callbacks' epoch methods: `EarlyStopping` stops the run,
  `ReduceLROnPlateau` and `LearningRateScheduler` set the rate the next epoch's steps
  read from the ps, `ModelCheckpoint`, `CSVLogger`, `TensorBoard` and `BackupAndRestore`
  write on the chief; `History` is returned;
- what cannot run as Keras runs it is refused before training, in one line: a
  batch-level callback, a model with its own `train_step`, EMA or gradient accumulation,
  `y`/`sample_weight`/`validation_split` with a dataset or a function (as Keras refuses
  them), arrays larger than `ps_arrays.MAX_BYTES`.
"""
from __future__ import annotations

import warnings

import keras
import tensorflow as tf

from mljob.fitting import ps_arrays, ps_inputs
from mljob.training import keras_private
from mljob.training.config import Program, RunConfig
from mljob.training.errors import UsageError
from mljob.training.evaluator import evaluate
from mljob.training.loop import Replica
from mljob.training.losses import unpack
from mljob.training.shared_state import tf_variable
from mljob.training.strategies import weight_parts


def fit(model, strategy, *, x=None, y=None, batch_size=None, epochs=1, verbose="auto",
        callbacks=None, validation_split=0.0, validation_data=None, shuffle=True,
        class_weight=None, sample_weight=None, initial_epoch=0, steps_per_epoch=None,
        validation_steps=None, validation_batch_size=None,
        validation_freq=1) -> keras.callbacks.History:
    """`model.fit(...)` on the chief of a ParameterServerStrategy cluster (module doc);
    the keywords are Keras 3's `Model.fit`'s. For a dataset or a function, `batch_size`
    and `shuffle` are the dataset's own (tf.keras 2 ignored them for datasets too); for
    arrays they are Keras's (`ps_arrays`)."""
    arrays = None
    if ps_arrays.given(x):  # as Keras's fit takes arrays (ps_arrays)
        arrays = ps_arrays.prepare(
            x, y, sample_weight, batch_size=batch_size, shuffle=shuffle,
            validation_split=validation_split, validation_data=validation_data,
            class_weight=class_weight, steps_per_epoch=steps_per_epoch)
        x, y, sample_weight, validation_split = arrays.per_worker, None, None, 0.0
        steps_per_epoch, batch_size = arrays.steps_per_epoch, arrays.batch_size
        if arrays.validation is not None:
            validation_data = arrays.validation
        validation_batch_size = validation_batch_size or batch_size
    ps_inputs.check_arguments(y=y, sample_weight=sample_weight,
                              validation_split=validation_split,
                              steps_per_epoch=steps_per_epoch, epochs=epochs,
                              initial_epoch=initial_epoch, validation_freq=validation_freq)
    if x is None:
        raise UsageError("fit needs x: arrays, a tf.data.Dataset or a function "
                         "(tf.distribute.InputContext) -> tf.data.Dataset")
    if not isinstance(model, keras.Model):
        raise UsageError(f"fit is a keras.Model's; got {type(model).__name__}")
    if not getattr(model, "compiled", False):
        raise UsageError("compile the model in strategy.scope() before fit (model.compile("
                         "optimizer=..., loss=..., metrics=[...])), as Keras's fit needs")
    train_fn = ps_inputs.per_worker(x)
    callback_list = ps_inputs.check_callbacks(callbacks)
    val_data = ps_inputs.validation(validation_data, validation_steps,
                                    validation_batch_size)
    if not model.built:  # as Keras's fit builds it: on one batch of the data
        features, _, _ = unpack(next(iter(ps_inputs.sample(x).take(1))))
        with strategy.scope():
            model(features)
    outside = [w.path for w in model.weights if not all(  # a sharded one: each shard
        strategy.extended.variable_created_in_scope(tf_variable(part))
        for part in weight_parts(w))]
    if outside:
        raise UsageError(f"the model's {outside[0]} was made outside strategy.scope(), "
                         "so it is not on the parameter servers: build and compile the "
                         "model inside `with strategy.scope():`")
    workers = keras_private.ps_workers(strategy)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    program = Program(model_fn=lambda: model, train_dataset_fn=train_fn,
                      class_weight=class_weight)
    config = RunConfig(job_dir="unused", train_steps=epochs * steps_per_epoch,
                       batch_size=batch_size or 1, eval_every=0, checkpoint_every=0,
                       ps_wire_dtype="float32")  # the reference's values, not bfloat16's
    replica = Replica(strategy, coordinator, program, config, num_workers=workers)
    replica.start_input(train_fn, seed=0)
    loop = _Loop(replica, model, callback_list, verbose, epochs, steps_per_epoch,
                 val_data, validation_freq)
    loop.pass_steps = arrays.pass_steps if arrays is not None else None
    return loop.run(initial_epoch)


class _Loop:
    """Keras's fit loop (keras/src/backend/tensorflow/trainer.py) at epoch grain."""

    def __init__(self, replica: Replica, model, callbacks, verbose, epochs: int,
                 steps_per_epoch: int, val_data, validation_freq: int):
        self.replica, self.model, self.epochs = replica, model, epochs
        self.steps_per_epoch, self.val_data = steps_per_epoch, val_data
        self.validation_freq = validation_freq
        # Arrays: the batches of one pass. Keras's fit ends an epoch early where a pass
        # ends (a steps_per_epoch that does not divide it), saying its input ran out.
        self.pass_steps: int | None = None
        self._pass_seen = 0
        verbose = 1 if verbose == "auto" else verbose
        self.callbacks = keras.callbacks.CallbackList(
            callbacks, add_history=True, add_progbar=verbose != 0, model=model,
            verbose=verbose, epochs=epochs, steps=steps_per_epoch)
        self.nan_watchers = [cb for cb in self.callbacks.callbacks
                             if isinstance(cb, keras.callbacks.TerminateOnNaN)]

    def run(self, initial_epoch: int) -> keras.callbacks.History:
        model, callbacks = self.model, self.callbacks
        model.stop_training = False
        callbacks.on_train_begin()
        # BackupAndRestore's epoch, as Keras's fit takes it.
        initial_epoch = keras_private.initial_epoch(model) or initial_epoch
        logs: dict = {}
        for epoch in range(initial_epoch, self.epochs):
            callbacks.on_epoch_begin(epoch)
            logs = self._train_epoch()
            for watcher in self.nan_watchers:  # each epoch's loss (module doc)
                watcher.on_batch_end(self.steps_per_epoch - 1, logs)
            if self.val_data is not None and (epoch + 1) % self.validation_freq == 0:
                logs.update({f"val_{k}": v for k, v in self._evaluate().items()})
            callbacks.on_epoch_end(epoch, logs)
            if model.stop_training:
                break
        # As Keras's fit ends (a no-op but for EMA, which ps refuses).
        model.optimizer.finalize_variable_values(model.trainable_weights)
        callbacks.on_train_end(logs=logs)
        return model.history

    def _train_epoch(self) -> dict:
        replica, done, handles = self.replica, 0, []
        steps = self.steps_per_epoch
        if self.pass_steps is not None:  # as Keras's epoch iterator over arrays
            steps = min(steps, self.pass_steps - self._pass_seen)
            if steps < self.steps_per_epoch:
                warnings.warn("Your input ran out of data; interrupting training. Make "
                              "sure that your dataset or generator can generate at least "
                              "`steps_per_epoch * epochs` batches.", stacklevel=2)
            self._pass_seen = (self._pass_seen + steps) % self.pass_steps
        while done < steps:
            num = min(replica.steps_per_execution, steps - done)
            handles.append(replica.run_chunk(num))
            done += num
        replica.sync()  # every step of the epoch has run: the callbacks see all of it
        loss, metrics = replica.result(handles)
        return {"loss": loss, **metrics}

    def _evaluate(self) -> dict:
        """Keras's evaluate inside fit: its test callbacks around the chief's run over
        the validation data (no batch-level calls)."""
        self.callbacks.on_test_begin()
        loss, metrics = evaluate(self.model, self.val_data, self.replica.objective,
                                 self.replica.strategy)
        logs = {"loss": loss, **metrics}
        self.callbacks.on_test_end(logs)
        return logs


__all__ = ["fit"]
