"""Keras's own `fit` under a MultiWorkerMirroredStrategy over several tasks.

Keras 3's `fit` fails there in two places (keras-team/keras#20585): it builds the model
from the first batch by reducing that batch over the replicas (`strategy.reduce` of
per-replica features, which a multi-worker strategy cannot convert), and it reduces each
step's logs with `strategy.reduce(MEAN, v, axis=0)`, which a scalar log has no axis 0
for. Everything else is Keras's and runs as it is: the loop (`Model.fit` itself: epochs,
`steps_per_epoch`, validation every `validation_freq` epochs, `initial_epoch`,
`class_weight`, sample weights), the steps (the model's own `train_step`/`test_step`,
or keras.Model's) run by `strategy.run` over `experimental_distribute_dataset`, the
optimizer's all-reduced update, `CallbackList` and `History`. What mljob changes, on
the model alone (`prepare`):

- the model is built from this worker's first replica's batch (the shapes are every
  replica's);
- each step's logs are expanded to a leading axis of one before Keras's own reduction,
  so `reduce(MEAN, axis=0)` is the mean over the replicas, element by element: what
  Keras's `reduce_per_replica("auto")` computes under a one-worker MirroredStrategy.

And around the loop (`fit`, `mljob.fitting.mirrored_callbacks`): `stop_training` agreed
by every worker, the chief's callbacks writing where the user said and the others' to a
temporary folder deleted afterwards, `BackupAndRestore` restoring every worker from the
chief's backup; arrays are shuffled alike on every worker (`mirrored_data`). What
would train something else is refused before the first step.
"""
from __future__ import annotations

import shutil
import tempfile
import weakref

import keras
import tensorflow as tf

from mljob.fitting.errors import FitRefused
from mljob.training import own_steps
from mljob.training.keras_private import make_function, model_strategy, \
    replace_symbolic_build, symbolic_build, tree
from mljob.fitting.mirrored_callbacks import is_chief, placed
from mljob.fitting.mirrored_data import as_dataset

_prepared: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def fit(model, original, **arguments):
    """Keras's `fit` (`original`, called with Keras's arguments) on a model whose strategy
    is a MultiWorkerMirroredStrategy over several tasks; returns Keras's History."""
    strategy = model.distribute_strategy
    check(model, arguments)
    arguments = as_dataset(arguments, strategy)
    prepare(model)
    chief = is_chief(strategy)
    scratch = None if chief else tempfile.mkdtemp(prefix="mljob-fit-")
    try:
        arguments["callbacks"] = placed(arguments.get("callbacks"), strategy, scratch)
        return original(model, **arguments)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def check(model, arguments: dict) -> None:
    """FitRefused, before training, for what cannot run here as Keras runs it."""
    where = "model.fit under MultiWorkerMirroredStrategy"
    for optimizer in own_steps.optimizers(model):
        for option in ("use_ema", "gradient_accumulation_steps"):
            if getattr(optimizer, option, None):
                raise FitRefused(
                    f"{where}: optimizer {optimizer.name} ({type(optimizer).__name__}) has "
                    f"{option}, which updates under a condition a synchronous replica "
                    "cannot take (Keras's fit fails on it under MirroredStrategy too); "
                    f"leave {option} out, or train on one node")
        if optimizer is not model.optimizer and not optimizer.built:
            raise FitRefused(
                f"{where}: optimizer {optimizer.name} ({type(optimizer).__name__}) is "
                "not built, and a replica's step cannot create its variables; build it "
                "in compile (optimizer.build(the variables it updates))")
    x = arguments.get("x")
    if isinstance(x, (tf.data.Dataset, tf.distribute.DistributedDataset)):
        return
    if isinstance(x, keras.utils.PyDataset) or _is_iterator(x):
        raise FitRefused(
            f"{where}: x is a {type(x).__name__}, which every worker would read whole "
            "and in its own order, so their shares could overlap; pass a "
            "tf.data.Dataset (each worker reads its share of it)")
    # arrays are taken: every worker shuffles them alike (mirrored_data)


def _is_iterator(x) -> bool:
    return hasattr(x, "__next__")


def prepare(model) -> None:
    """The model's train and test functions and its first build, made for a
    multi-worker strategy (see the module doc); once per compile."""
    made = _prepared.get(model)
    if made is not None and model.train_function is made[0] \
            and model.test_function is made[1]:
        return
    # Keras's own step functions (its multi-step loop, its Optional handling at the end
    # of the data), around the model's steps with their logs given a replica axis.
    model.train_function = make_function(model, _replica_axis(model.train_step))
    model.test_function = make_function(model, _replica_axis(model.test_step))
    replace_symbolic_build(model, _symbolic_build(model))
    _prepared[model] = (model.train_function, model.test_function)


def _replica_axis(step):
    def with_axis(data):
        return tree.map_structure(lambda v: tf.expand_dims(v, 0), step(data))
    return with_axis


def _symbolic_build(model):
    """Keras's `_maybe_symbolic_build`, from this worker's first replica's batch."""
    def build(iterator=None, data_batch=None):
        strategy = model_strategy(model)
        if strategy is None:  # as Keras: built when the step is traced
            return
        if iterator is not None:
            for _, _, it in iterator:
                batch = next(it)
                data_batch = tree.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0], batch)
                break
        with strategy.scope():
            symbolic_build(model, data_batch)
    return build


__all__ = ["fit", "check", "prepare"]
