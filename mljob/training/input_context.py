"""What a run's `train_dataset_fn` is given: TensorFlow's input context, with the
per-replica batch size and the shuffle seed added."""
from __future__ import annotations

import tensorflow as tf


class InputContext(tf.distribute.InputContext):
    """What `train_dataset_fn` is given: TensorFlow's input context (which pipeline this
    is, of how many), plus the per-replica `batch_size` and the shuffle `seed`."""

    def __init__(self, num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1,
                 *, global_batch_size: int, seed: int):
        super().__init__(num_input_pipelines, input_pipeline_id, num_replicas_in_sync)
        self.batch_size = self.get_per_replica_batch_size(global_batch_size)
        self.seed = seed

    @classmethod
    def from_tf(cls, context: tf.distribute.InputContext, global_batch_size: int,
                seed: int) -> "InputContext":
        return cls(context.num_input_pipelines, context.input_pipeline_id,
                   context.num_replicas_in_sync, global_batch_size=global_batch_size,
                   seed=seed)


__all__ = ["InputContext"]
