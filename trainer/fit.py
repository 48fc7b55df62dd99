"""The bundled trainer's run: the CNN or MLP on Fashion-MNIST, given to
`mljob.training.fit` (which does the rest under every role: strategies, checkpoints,
summaries, SIGTERM, the evaluator and the export).
"""
from __future__ import annotations

import functools

import keras
import tensorflow as tf

from mljob import startup, training
from mljob.contracts import EVALUATOR, PS
from mljob.training import kernels
from mljob.training import precision as precision_lib
from trainer.errors import UsageError
from trainer import data as data_lib
from trainer import export as export_lib
from trainer import model as model_lib

EVAL_BATCH_SIZE = 1000
SCHEDULES = ("constant", "cosine")  # trainer.task.SCHEDULES (--lr-schedule)


def cross_entropy(labels, logits):
    # Called as compile calls a loss function: the labels arrive as float32 (Keras casts
    # them); the class indices, exact in float32, go back to integers.
    return tf.nn.sparse_softmax_cross_entropy_with_logits(tf.cast(labels, tf.int32), logits)


def learning_rate_schedule(kind: str, learning_rate: float, train_steps: int):
    """Adam's learning_rate for --lr-schedule: the number itself (constant), or a Keras
    schedule of the optimizer's step count (its `iterations`, which every role advances
    once a step and the checkpoints keep): cosine goes from learning_rate at step 0 down
    to 0 at train_steps along half a cosine, and stays at 0 after."""
    if kind == "constant":
        return learning_rate
    if kind == "cosine":
        return keras.optimizers.schedules.CosineDecay(learning_rate,
                                                      decay_steps=train_steps, alpha=0.0)
    raise ValueError(f"unknown learning-rate schedule {kind!r}; one of {SCHEDULES}")


def run(args, config: training.RunConfig, info, stop=None, *, dropout: float,
        learning_rate: float = 1e-3, lr_schedule: str = "constant") -> int:
    """Play this replica's role with the flags' model and data; the exit status.
    `dropout`, `learning_rate` and `lr_schedule` are the flags' as
    `trainer.task.dropout_of`, `learning_rate_of` and `lr_schedule_of` resolve them (the
    flags' module imports this one, never the reverse)."""
    load = functools.lru_cache(maxsize=1)(
        lambda: data_lib.load(args.data_dir, args.train_files, args.eval_files))
    if info is not None and info.task_type in (PS, EVALUATOR):
        pass  # a ps reads no data; the evaluator reads only the test split
    elif args.batch_size > len(load().train_labels):  # no full batch: no step would run
        raise UsageError(f"--batch-size {args.batch_size} is more than the "
                         f"{len(load().train_labels)} training examples; use a smaller one")
    startup.mark("data")

    def train_dataset_fn(context):
        dataset = load()
        return data_lib.train_dataset(dataset.train_images, dataset.train_labels,
                                      context.batch_size,
                                      shard_index=context.input_pipeline_id,
                                      num_shards=context.num_input_pipelines,
                                      seed=context.seed)

    def eval_dataset_fn():
        dataset = load()
        return data_lib.eval_dataset(dataset.test_images, dataset.test_labels,
                                     EVAL_BATCH_SIZE)

    # Decided once, here, before any model is built; the chief says which and why.
    choice = precision_lib.resolve(args.mixed_precision,
                                   gpu_capabilities=_gpu_capabilities())
    if info is None or info.is_chief:
        print(choice.line(), flush=True)
        print(kernels.choose_once().line(), flush=True)

    def describe() -> str:
        return (f"model={args.model} learning_rate={learning_rate:g} "
                f"lr_schedule={lr_schedule} mixed_precision={choice.policy} "
                f"data={load().source!r}")

    return training.fit(
        functools.partial(model_lib.build, args.model, dropout=dropout, seed=args.seed,
                          precision=choice.policy, hidden_units=args.hidden_units),
        train_dataset_fn, eval_dataset_fn=eval_dataset_fn, loss=cross_entropy,
        optimizer=lambda: keras.optimizers.Adam(learning_rate_schedule(
            lr_schedule, learning_rate, config.train_steps)),
        metrics=["accuracy"], serving=export_lib.serving(args.model, args.hidden_units),
        describe=describe,
        config=config, info=info, stop=stop)


def _gpu_capabilities() -> list[tuple[int, int]]:
    """The compute capabilities of the GPUs TensorFlow sees (none on a CPU machine)."""
    found = []
    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        found.append(tuple(details.get("compute_capability") or (0, 0)))
    return found


__all__ = ["run", "cross_entropy", "learning_rate_schedule", "EVAL_BATCH_SIZE",
           "SCHEDULES"]
