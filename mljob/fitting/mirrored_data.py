"""Arrays given to `model.fit` under a MultiWorkerMirroredStrategy over several tasks.

Keras turns arrays into a tf.data pipeline that shuffles its indices afresh each epoch
with an unseeded `tf.random.shuffle`; every worker builds that pipeline and keeps its
share of the batches (TensorFlow's DATA sharding), so with a different permutation on
each worker their shares would overlap and some examples would not be seen in an epoch:
another training than one node's. Here the arrays become a dataset that every worker
shuffles with one seed (the chief's, all-reduced), reshuffled each epoch: each epoch is
one permutation of the examples, as on one node, with the batch size, partial last
batch, `validation_split` (the last examples, before shuffling, as Keras takes them) and
`shuffle="batch"` (whole batches shuffled) of Keras's array adapter.
"""
from __future__ import annotations

import random

import keras
import tensorflow as tf

from mljob.fitting.mirrored_callbacks import is_chief
from mljob.training.keras_private import train_validation_split

DEFAULT_BATCH_SIZE = 32  # Keras's, when fit is given arrays and no batch_size


def as_dataset(arguments: dict, strategy) -> dict:
    """Keras's fit arguments with array `x` (and `y`, `sample_weight`) as a dataset every
    worker shuffles alike; other arguments as given."""
    x = arguments.get("x")
    if x is None or isinstance(x, (tf.data.Dataset, tf.distribute.DistributedDataset)):
        return arguments
    arguments = dict(arguments)
    y, weights = arguments.pop("y", None), arguments.pop("sample_weight", None)
    split = arguments.get("validation_split") or 0.0
    if split and arguments.get("validation_data") is None:
        (x, y, weights), validation = train_validation_split((x, y, weights),
                                                             validation_split=split)
        arguments["validation_data"] = validation
    arguments["validation_split"] = 0.0
    batch = arguments.pop("batch_size", None) or DEFAULT_BATCH_SIZE
    if arguments.get("validation_batch_size") is None:
        arguments["validation_batch_size"] = batch
    shuffle = arguments.get("shuffle")
    data = keras.utils.pack_x_y_sample_weight(x, y, weights)
    examples = tf.data.Dataset.from_tensor_slices(data)
    count = int(examples.cardinality())
    if shuffle == "batch":
        dataset = examples.batch(batch).shuffle(max(1, -(-count // batch)),
                                                seed=shared_seed(strategy),
                                                reshuffle_each_iteration=True)
    elif shuffle:
        dataset = examples.shuffle(count, seed=shared_seed(strategy),
                                   reshuffle_each_iteration=True).batch(batch)
    else:
        dataset = examples.batch(batch)
    arguments["x"] = dataset.prefetch(tf.data.AUTOTUNE)
    return arguments


def shared_seed(strategy) -> int:
    """One random seed for every worker: the chief's, all-reduced (the others add 0)."""
    mine = random.randrange(1, 2**31 - 1) if is_chief(strategy) else 0

    def replica(value):
        context = tf.distribute.get_replica_context()
        first = tf.cast(context.replica_id_in_sync_group == 0, tf.int64)
        return context.all_reduce(tf.distribute.ReduceOp.SUM, value * first)

    total = strategy.run(tf.function(replica, autograph=False),
                         args=(tf.constant(mine, tf.int64),))
    return int(strategy.experimental_local_results(total)[0])


__all__ = ["as_dataset", "shared_seed", "DEFAULT_BATCH_SIZE"]
