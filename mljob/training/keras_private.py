"""Every name mljob takes from Keras that Keras does not export: its private modules
(`keras.src...`) and private attributes, in one place (and the one TensorFlow attribute
`mljob.fitting` reads).

A Keras release may move any of them; `setup.py` pins `keras` to the minor range the
suite passes with, and tests/mljob/test_keras_private.py imports each one here and
fails naming the one a release moved. Whoever raises the pin runs that test first.
"""
from __future__ import annotations

from keras.src import tree
from keras.src.losses.losses import LossFunctionWrapper
from keras.src.trainers import compile_utils



def initial_epoch(model) -> int | None:
    """The epoch `keras.callbacks.BackupAndRestore` restored in `on_train_begin`
    (Keras's fit reads `model._initial_epoch` the same way), else None."""
    return model._initial_epoch


def tensorboard_profiles(callback) -> bool:
    """Whether a `keras.callbacks.TensorBoard` profiles some batches (`profile_batch`,
    kept as its `_start_batch`/`_stop_batch`)."""
    return bool(callback._start_batch or callback._stop_batch)


def ps_workers(strategy) -> int:
    """How many workers a ParameterServerStrategy schedules on (TensorFlow's: its
    public `cluster_resolver` is None for ParameterServerStrategy)."""
    return int(strategy.extended._num_workers)


__all__ = ["ps_workers", "tree", "LossFunctionWrapper", "compile_utils", "initial_epoch",
           "tensorboard_profiles"]
