"""Every name mljob takes from Keras that Keras does not export, in one place: its
private modules (`keras.src...`) and the private attributes of its objects (and the one
TensorFlow attribute `mljob.fitting` reads).

A Keras release may move any of them. `setup.py` pins `keras` to the minor range the
suite passes with; tests/mljob/test_keras_private.py reaches every one of them here and
fails naming the one a release moved. Whoever raises the pin runs that test first.

- `keras.src.tree`: nested structures flattened as Keras flattens them;
- `keras.src.losses.loss.scale_loss_for_distribution` and `unscale_...`: a loss scaled
  by the replica count as Keras's fit scales it;
- `keras.src.losses.losses.LossFunctionWrapper` and `keras.src.utils.naming
  .get_object_name`: a plain loss function wrapped and named as `compile` does it;
- `keras.src.trainers.compile_utils` (`CompileLoss`, `CompileMetrics`, and their
  `_flat_losses`, `_flat_metrics`, `_flat_weighted_metrics`): what `compile` takes,
  resolved by Keras's own code;
- `keras.src.backend.common.global_state` (`object_name_uids`): fresh automatic names for
  the evaluator's and the export's models;
- `Layer._flatten_layers`: every layer of a model (the export's lookup tables);
- `Layer._get_regularization_losses`: the regularizers on given weights (ps local steps);
- `Adam._momentums`, `._velocities`, `._get_variable_index`, `Optimizer._learning_rate`:
  Adam's slots and its schedule (ps local steps, the fused update);
- `AUC._from_logits`; `Trainer._initial_epoch` (the epoch `BackupAndRestore` restored,
  read as Keras's fit reads it); `TensorBoard._start_batch`, `._stop_batch`;
- TensorFlow's `ParameterServerStrategy.extended._num_workers`;
- for Keras's fit under MultiWorkerMirroredStrategy (`mljob.fitting.mirrored`):
  `Trainer._make_function` (Keras's multi-step loop around a step),
  `._maybe_symbolic_build` / `._symbolic_build` (the model built before its first step),
  `._distribute_strategy`; `keras.src.trainers.data_adapters.array_slicing
  .train_validation_split` (`validation_split` as fit splits arrays);
  `keras.src.trainers.data_adapters.tf_dataset_adapter.make_class_weight_map_fn`
  (`class_weight` mapped onto a dataset as fit maps it); `keras.src.utils.python_utils
  .pythonify_logs` (nested logs flattened as fit flattens them);
- the module Keras defines `keras.Model` in (`MODEL_MODULE`), which the launcher waits
  for (`mljob.fitting` keeps the name as a string: it imports no Keras).
"""
from __future__ import annotations

import collections
import contextlib

from keras.src import tree
from keras.src.backend.common import global_state
from keras.src.losses.loss import scale_loss_for_distribution, unscale_loss_for_distribution
from keras.src.losses.losses import LossFunctionWrapper
from keras.src.trainers import compile_utils
from keras.src.trainers.data_adapters.array_slicing import train_validation_split
from keras.src.trainers.data_adapters.tf_dataset_adapter import make_class_weight_map_fn
from keras.src.utils.python_utils import pythonify_logs
from keras.src.utils.naming import get_object_name


@contextlib.contextmanager
def fresh_object_names():
    """Keras's automatic names (`dense`, `dense_1`...) counted from zero in here."""
    before = global_state.get_global_attribute("object_name_uids")
    global_state.set_global_attribute("object_name_uids", collections.defaultdict(int))
    try:
        yield
    finally:
        global_state.set_global_attribute("object_name_uids", before)


def flat_losses(compile_loss) -> list:
    """CompileLoss's (path, loss, weight, output name) per output, once built."""
    return compile_loss._flat_losses


def flat_metrics(compile_metrics) -> tuple[list, list]:
    """CompileMetrics' (metrics, weighted metrics) per output, once built."""
    return compile_metrics._flat_metrics, compile_metrics._flat_weighted_metrics


def auc_from_logits(metric) -> bool:
    return bool(metric._from_logits)


def all_layers(model) -> list:
    """The model and every layer in it, nested models' too."""
    return list(model._flatten_layers(include_self=True, recursive=True))


def regularization_losses(model) -> list:
    """The weights' regularizer terms, computed now (on the weights a StatelessScope
    maps, inside one)."""
    return model._get_regularization_losses()


def adam_slots(optimizer, variables) -> tuple[list, list]:
    """Adam's (first moments, second moments) of `variables`, in their order."""
    index = [optimizer._get_variable_index(v) for v in variables]
    return ([optimizer._momentums[i] for i in index],
            [optimizer._velocities[i] for i in index])


def learning_rate_setting(optimizer):
    """What the optimizer's learning rate was given as: a variable, or a
    LearningRateSchedule (the public `learning_rate` is the schedule's current value)."""
    return optimizer._learning_rate


def initial_epoch(model) -> int | None:
    """The epoch `keras.callbacks.BackupAndRestore` restored in `on_train_begin`
    (Keras's fit reads `model._initial_epoch` the same way), else None."""
    return model._initial_epoch


def tensorboard_profiles(callback) -> bool:
    """Whether a `keras.callbacks.TensorBoard` profiles some batches (`profile_batch`)."""
    return bool(callback._start_batch or callback._stop_batch)


def ps_workers(strategy) -> int:
    """How many workers a ParameterServerStrategy schedules on (TensorFlow's: its
    public `cluster_resolver` is None for ParameterServerStrategy)."""
    return int(strategy.extended._num_workers)


def make_function(model, step):
    """Keras's own train/test function (its multi-step loop, its Optional handling at
    the end of the data) around `step`."""
    return model._make_function(step)


def model_strategy(model):
    """The distribution strategy the model was made under (None: Keras's default)."""
    return model._distribute_strategy


def symbolic_build(model, data_batch) -> None:
    """Keras's build of a model and its compiled parts from one batch, as fit does
    before its first step."""
    model._symbolic_build(data_batch=data_batch)


def replace_symbolic_build(model, build) -> None:
    """What fit calls to build the model before its first step (`_maybe_symbolic_build`)."""
    model._maybe_symbolic_build = build


MODEL_MODULE = "keras.src.models.model"


__all__ = ["tree", "scale_loss_for_distribution", "unscale_loss_for_distribution",
           "LossFunctionWrapper", "compile_utils", "get_object_name", "fresh_object_names",
           "flat_losses", "flat_metrics", "auc_from_logits", "all_layers",
           "regularization_losses", "adam_slots", "learning_rate_setting",
           "initial_epoch", "tensorboard_profiles", "ps_workers", "make_function",
           "model_strategy", "symbolic_build", "replace_symbolic_build", "MODEL_MODULE",
           "train_validation_split", "make_class_weight_map_fn", "pythonify_logs"]
