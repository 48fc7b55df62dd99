"""What `ps_fit.fit` takes, checked before training: the data as each worker's input
pipeline, the validation data the chief evaluates, and the callbacks the coordinator
can run as Keras runs them.

Data (`x`, as tf.keras 2's `fit` took it under ParameterServerStrategy; arrays are
`ps_arrays`'):
- a `tf.data.Dataset` made on the chief: serialized and rebuilt on every worker (as
  `ClusterCoordinator.create_per_worker_dataset` does with a dataset), each worker
  reading all of it in its own order;
- a function of a `tf.distribute.InputContext` returning a dataset: run on each worker
  (`input_pipeline_id` that worker's index, `num_input_pipelines` the workers), as
  tf.keras 2's `keras.utils.experimental.DatasetCreator` ran it. Keras 3 has no
  `DatasetCreator`: give the function itself.

Callbacks: the coordinator runs them at the epoch boundaries, where the workers' steps
have all finished (`coordinator.join()`): what Keras calls per epoch runs as in Keras.
Nothing runs per batch (the steps are scheduled asynchronously on the workers and their
logs are fetched once an epoch, as tf.keras 2 required): a callback of one's own with a
batch-level method is refused (tf.keras 2 refused it too), and so is a stock callback
asked to act per batch (`ModelCheckpoint`/`BackupAndRestore` with an integer
`save_freq`, `TensorBoard` with an integer `update_freq` or a `profile_batch`).
`TerminateOnNaN` looks at each epoch's loss; `ProgbarLogger` draws one bar an epoch.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from mljob.training import keras_private
from mljob.training.errors import UsageError

# Keras's own callbacks whose batch-level methods do nothing at the settings checked in
# `_batch_level_setting`, or that the loop calls once an epoch (TerminateOnNaN).
_EPOCH_LEVEL_STOCK = (keras.callbacks.ProgbarLogger, keras.callbacks.History,
                      keras.callbacks.TensorBoard, keras.callbacks.ModelCheckpoint,
                      keras.callbacks.BackupAndRestore, keras.callbacks.TerminateOnNaN)
BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin",
               "on_train_batch_end", "on_test_batch_begin", "on_test_batch_end",
               "on_predict_batch_begin", "on_predict_batch_end")
# tf.data's ExternalStatePolicy.WARN: a dataset with state (a random seed) is shipped,
# its state starting afresh on each worker.
_WARN = 0


def per_worker(x) -> Callable[[Any], tf.data.Dataset]:
    """`x` as a function of the worker's input context (see the module doc)."""
    if isinstance(x, tf.data.Dataset):
        graph = tf.raw_ops.DatasetToGraphV2(input_dataset=tf.data.experimental.to_variant(x),
                                            external_state_policy=_WARN,
                                            strip_device_assignment=True)
        spec = x.element_spec

        def rebuilt(context):
            del context  # every worker reads the whole dataset, as tf.keras 2's did
            return tf.data.experimental.from_variant(
                tf.raw_ops.DatasetFromGraph(graph_def=graph), spec)
        return rebuilt
    if callable(x) and not isinstance(x, (tf.Tensor, tf.Variable)):
        return x
    raise UsageError(
        f"x is a {type(x).__name__}: under ParameterServerStrategy fit takes NumPy "
        "arrays (or tensors, lists or dicts of them), a tf.data.Dataset or a function "
        "(tf.distribute.InputContext) -> tf.data.Dataset run on each worker (Keras 3 has "
        "no DatasetCreator: pass the function itself)")


def sample(x) -> tf.data.Dataset:
    """A copy of the training data on the chief (to build an unbuilt model from one
    batch)."""
    return x if isinstance(x, tf.data.Dataset) else x(tf.distribute.InputContext())


def validation(validation_data, validation_steps, validation_batch_size):
    """The chief's finite validation dataset, or None."""
    if validation_data is None:
        return None
    data = validation_data
    if isinstance(data, (tuple, list)):
        if not 2 <= len(data) <= 3:
            raise UsageError("validation_data as a tuple is (x_val, y_val) or (x_val, "
                             "y_val, val_sample_weight)")
        data = tf.data.Dataset.from_tensor_slices(tuple(data)).batch(
            validation_batch_size or 32)
    elif not isinstance(data, tf.data.Dataset):
        if not callable(data):
            raise UsageError(
                f"validation_data of type {type(data).__name__}: give a tf.data.Dataset, a "
                "function (tf.distribute.InputContext) -> tf.data.Dataset, or "
                "(x_val, y_val) arrays")
        data = data(tf.distribute.InputContext())
    if validation_steps is not None:
        if not isinstance(validation_steps, int) or validation_steps < 1:
            raise UsageError(f"validation_steps must be a positive integer, got "
                             f"{validation_steps!r}")
        return data.take(validation_steps)
    if data.cardinality() == tf.data.INFINITE_CARDINALITY:
        raise UsageError("validation_data repeats forever and no validation_steps was "
                         "given: give validation_steps (the batches each evaluation reads)")
    return data


def check_arguments(*, y, sample_weight, validation_split, steps_per_epoch, epochs,
                    initial_epoch, validation_freq) -> None:
    """One line for each `fit` argument parameter servers cannot take as given."""
    if steps_per_epoch is None:
        raise UsageError(
            "steps_per_epoch is required under ParameterServerStrategy (as tf.keras 2's "
            "fit required it): the workers read endless input, so give fit "
            "steps_per_epoch=N (and repeat the dataset)")
    if not isinstance(steps_per_epoch, int) or isinstance(steps_per_epoch, bool) \
            or steps_per_epoch < 1:
        raise UsageError(f"steps_per_epoch must be a positive integer, got "
                         f"{steps_per_epoch!r}")
    if y is not None or sample_weight is not None:
        raise UsageError("x is a dataset or a function: its elements hold the labels (and "
                         "sample weights), (features, labels[, weights]), as Keras's fit "
                         "takes them; leave y and sample_weight out")
    if validation_split:
        raise UsageError("validation_split splits arrays only (Keras's fit refuses it for "
                         "a dataset too): give validation_data")
    for name, value in (("epochs", epochs), ("validation_freq", validation_freq)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UsageError(f"{name} must be a positive integer under "
                             f"ParameterServerStrategy, got {value!r}")
    if not isinstance(initial_epoch, int) or initial_epoch < 0:
        raise UsageError(f"initial_epoch must be an integer >= 0, got {initial_epoch!r}")


def check_callbacks(callbacks) -> list:
    """The callbacks as a list; UsageError for one that would act per batch."""
    flat = list(callbacks or [])
    for cb in flat:
        if not isinstance(cb, keras.callbacks.Callback):
            raise UsageError(f"callbacks holds a {type(cb).__name__}, not a "
                             "keras.callbacks.Callback")
        setting = _batch_level_setting(cb)
        if setting:
            raise UsageError(
                f"{type(cb).__name__}({setting}) acts every few batches, which "
                "parameter servers cannot run as Keras does (the workers' steps are "
                "fetched once an epoch); use it per epoch and choose steps_per_epoch")
        if isinstance(cb, _EPOCH_LEVEL_STOCK):
            continue
        hooks = [h for h in BATCH_HOOKS
                 if getattr(type(cb), h) is not getattr(keras.callbacks.Callback, h)]
        if isinstance(cb, keras.callbacks.LambdaCallback):
            hooks = [h for h in BATCH_HOOKS if h in vars(cb)
                     and getattr(cb, h) is not None]
        if hooks:
            raise UsageError(
                f"callback {type(cb).__name__} has batch-level methods ({', '.join(hooks)})"
                ", which parameter servers cannot run (tf.keras 2 refused them too): "
                "move its work to on_epoch_end and choose steps_per_epoch")
    return flat


def _batch_level_setting(cb) -> str:
    if isinstance(cb, (keras.callbacks.ModelCheckpoint, keras.callbacks.BackupAndRestore)) \
            and cb.save_freq != "epoch":
        return f"save_freq={cb.save_freq}"
    if isinstance(cb, keras.callbacks.TensorBoard):
        if cb.update_freq != "epoch":
            return f"update_freq={cb.update_freq}"
        if keras_private.tensorboard_profiles(cb):
            return "profile_batch=..."
    return ""


__all__ = ["per_worker", "sample", "validation", "check_arguments", "check_callbacks",
           "BATCH_HOOKS"]
