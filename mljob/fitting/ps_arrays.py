"""Arrays given to `model.fit` under ParameterServerStrategy, as Keras's `fit` takes
them on one node: `x` (and `y`, `sample_weight`) as NumPy arrays or tensors, or lists
and dicts of them.

- Each worker's input pipeline is made from the arrays: the function that builds it
  (`tf.data.Dataset.from_tensor_slices`) is traced on the chief with the arrays as
  constants in its graph, and that graph is sent to every worker when the run starts
  (`ClusterCoordinator.create_per_worker_dataset`). Every worker reads all of the
  examples: with `shuffle=True` in an order of its own, reshuffled at each pass (as a
  dataset given to `fit` is read under ps), in order with `shuffle=False`, whole
  batches shuffled with `shuffle="batch"`; batched by `batch_size` (without it, Keras's:
  ceil(examples / steps_per_epoch) when the steps are given, else 32; the last batch
  of a pass partial), read endlessly.
- `steps_per_epoch` defaults to ceil(examples / batch_size), as Keras computes it; given,
  an epoch is as many steps but ends early where a pass ends, as Keras's epoch iterator
  ends it (with its warning that the input ran out), the next epoch going on with the
  next pass (`ps_fit` counts the passes' steps as Keras does); with one worker and
  `shuffle=False` the epochs read the batches Keras's read.
- `validation_split`: the last fraction of the examples, before any shuffling, split off
  as Keras splits them (`train_validation_split`), evaluated on the chief as
  `validation_data` is.
- The graph a worker receives holds the arrays: the training arrays are refused above
  `MAX_BYTES` (one line naming the fix: a dataset function reading files on the workers).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from mljob.training.errors import UsageError
from mljob.training.keras_private import train_validation_split

DEFAULT_BATCH_SIZE = 32  # Keras's, when fit is given arrays and no batch_size
# The training arrays' bytes a run ships in the per-worker dataset function's graph
# (each worker receives the graph, the chief holds it too; a GraphDef has a hard limit
# of 2 GiB). Measured on a ps and a worker on one machine: 4096x784 float32 (12 MiB)
# adds 0.4 s to the start, Fashion-MNIST's 60000x784 float32 (179 MiB) 15 s and 1.1 GiB
# on the chief. Above, a function reading files on the workers.
MAX_BYTES = 256 << 20


@dataclass
class Arrays:
    """What `ps_fit.fit` runs from arrays."""
    per_worker: Any            # function (InputContext) -> the worker's endless dataset
    validation: tuple | None   # (x_val, y_val[, w_val]) split off by validation_split
    steps_per_epoch: int
    batch_size: int
    pass_steps: int            # the batches of one pass over the training examples


def given(x) -> bool:
    """Whether `x` is arrays as Keras's fit takes them (NumPy arrays or tensors, or a
    list, tuple or dict of them)."""
    if x is None or isinstance(x, tf.data.Dataset) or callable(x):
        return False
    leaves = keras.tree.flatten(x)
    return bool(leaves) and all(_is_array(v) for v in leaves)


def _is_array(value) -> bool:
    return isinstance(value, (np.ndarray, tf.Tensor)) or (
        hasattr(value, "__array__") and hasattr(value, "shape")
        and not isinstance(value, tf.Variable))


def prepare(x, y, sample_weight, *, batch_size, shuffle, validation_split,
            validation_data, class_weight, steps_per_epoch) -> Arrays:
    """The arrays as each worker's pipeline (module doc); UsageError in one line for
    what Keras's fit refuses too or what is too large to ship."""
    for name, value in (("y", y), ("sample_weight", sample_weight)):
        if value is not None and not all(_is_array(v) for v in keras.tree.flatten(value)):
            raise UsageError(f"x is arrays but {name} is a {type(value).__name__}: give "
                             f"{name} as arrays of x's length, as Keras's fit takes them")
    if sample_weight is not None and class_weight is not None:
        raise UsageError("fit was given both class_weight and sample_weight (Keras's fit "
                         "refuses them together): give one")
    data = keras.tree.map_structure(_as_array, keras.tree.lists_to_tuples(
        (x, y, sample_weight)))
    sizes = {name: sorted({int(v.shape[0]) for v in keras.tree.flatten(part)})
             for name, part in zip(("x", "y", "sample_weight"), data, strict=True)
             if part is not None}
    if len({n for found in sizes.values() for n in found}) > 1:
        said = "; ".join(f"{name}: {', '.join(map(str, found))}"
                         for name, found in sizes.items())
        raise UsageError(f"the arrays given to fit hold different numbers of examples "
                         f"({said}): give x, y and sample_weight the same first dimension")
    validation = None
    if validation_split:
        if not isinstance(validation_split, (int, float)) or not 0 < validation_split < 1:
            raise UsageError(f"validation_split must be a fraction between 0 and 1, got "
                             f"{validation_split!r}")
        if validation_data is None:
            try:
                data, held = train_validation_split(data, validation_split=validation_split)
            except ValueError as e:
                raise UsageError(" ".join(str(e).split())) from None
            validation = tuple(v for v in held if v is not None)
    count = int(keras.tree.flatten(data)[0].shape[0])
    total = sum(_nbytes(v) for v in keras.tree.flatten(data) if v is not None)
    if total > MAX_BYTES:
        raise UsageError(
            f"the arrays given to fit hold {total / 2**20:.1f} MiB, more than the "
            f"{MAX_BYTES >> 20} MiB parameter servers ship to every worker in a graph: "
            "give x as a function (tf.distribute.InputContext) -> tf.data.Dataset that "
            "reads the examples from files on each worker")
    if batch_size is None:  # Keras's: from the steps when given, else 32
        batch_size = math.ceil(count / steps_per_epoch) \
            if isinstance(steps_per_epoch, int) and steps_per_epoch > 0 \
            else DEFAULT_BATCH_SIZE
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise UsageError(f"batch_size must be a positive integer, got {batch_size!r}")
    if shuffle not in (True, False, "batch"):
        raise UsageError(f"shuffle must be True, False or \"batch\", got {shuffle!r}")
    packed = keras.utils.pack_x_y_sample_weight(*data)
    base = random.randrange(1, 2**31 - 1)  # each worker's seed: this one plus its index

    def per_worker(context) -> tf.data.Dataset:
        dataset = tf.data.Dataset.from_tensor_slices(packed)
        seed = tf.cast(context.input_pipeline_id, tf.int64) + base
        if shuffle == "batch":
            dataset = dataset.batch(batch_size).shuffle(
                max(1, math.ceil(count / batch_size)), seed=seed,
                reshuffle_each_iteration=True)
        elif shuffle:
            dataset = dataset.shuffle(count, seed=seed,
                                      reshuffle_each_iteration=True).batch(batch_size)
        else:
            dataset = dataset.batch(batch_size)
        return dataset.repeat().prefetch(tf.data.AUTOTUNE)

    steps = steps_per_epoch if steps_per_epoch is not None else \
        math.ceil(count / batch_size)
    return Arrays(per_worker, validation, steps, batch_size, math.ceil(count / batch_size))


def _as_array(value):
    """A NumPy array, floats in Keras's floatx (as Keras's array adapter casts them)."""
    if value is None:
        return None
    array = np.asarray(value)
    if array.dtype.kind == "f" and array.dtype != np.dtype(keras.config.floatx()):
        array = array.astype(keras.config.floatx())
    return array


def _nbytes(value) -> int:
    size = getattr(value, "nbytes", None)
    if size is None:
        size = int(np.prod(value.shape)) * tf.as_dtype(value.dtype).size
    return int(size)


__all__ = ["Arrays", "given", "prepare", "DEFAULT_BATCH_SIZE", "MAX_BYTES"]
