"""Evaluation on the test set: inline on the chief, and the evaluator replica.

The evaluator is not part of the training cluster (TensorFlow's strategies hang when it
is); it follows the chief's checkpoints (`<job-dir>/checkpoints/`, or AIP_CHECKPOINT_DIR:
config.checkpoint_url) through the `checkpoint` state file (published last, so the
checkpoint it names is complete), evaluates each new checkpoint on the test set, writes
`eval/` events under config.summary_url, and exits 0 once it has evaluated the
final checkpoint (step >= --train-steps). SIGTERM, SIGINT or the launcher's death
(MLJOB_PARENT_PID) end it early, also with status 0: being stopped is how it ends when
the chief fails.
"""
from __future__ import annotations

import weakref

import tensorflow as tf

from mljob.errors import first_line
from trainer import data as data_lib
from trainer import model as model_lib
from trainer.checkpoints import CheckpointStore
from trainer.errors import EXIT_OK
from trainer.servers import StopSignal
from trainer.summaries import Progress, SummaryWriters

EVAL_BATCH_SIZE = 1000
POLL_SECONDS = 1.0

_eval_steps: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def evaluate(model, dataset: data_lib.Dataset,
             batch_size: int = EVAL_BATCH_SIZE) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of `model` over the whole test set."""
    step = _eval_steps.get(model)
    if step is None:
        @tf.function
        def step(images, labels):
            logits = model(images, training=False)
            losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
            correct = tf.equal(tf.argmax(logits, axis=1), labels)
            return tf.reduce_sum(losses), tf.reduce_sum(tf.cast(correct, tf.float32))
        _eval_steps[model] = step
    total_loss, total_correct = 0.0, 0.0
    for images, labels in data_lib.eval_dataset(dataset.test_images, dataset.test_labels,
                                                batch_size):
        loss, correct = step(images, labels)
        total_loss += float(loss)
        total_correct += float(correct)
    count = max(1, len(dataset.test_labels))
    return total_loss / count, total_correct / count


def run(config, stop: StopSignal, poll_seconds: float = POLL_SECONDS) -> int:
    """Follow the job's checkpoints until the final one is evaluated (see module doc)."""
    dataset = data_lib.load(config.data_dir, config.train_files, config.eval_files)
    model = model_lib.build(config.model, dropout=config.dropout,
                            hidden_units=config.hidden_units)
    step_var = tf.Variable(0, dtype=tf.int64, trainable=False)
    checkpoint = tf.train.Checkpoint(model={w.path: w.value for w in model.weights},
                                     step=step_var)
    store = CheckpointStore(config.checkpoint_url, keep=config.keep_checkpoints,
                            writer=False)
    writers = SummaryWriters(config.summary_url, enabled=True, jobs=("eval",))
    progress = Progress(config.train_steps, enabled=True)
    progress.line(f"evaluator started: following {store.url} until step "
                  f"{config.train_steps}")
    last = None
    try:
        while True:
            step = store.latest_published_step()
            if step is not None and step != last:
                try:
                    checkpoint.read(store.local_prefix(step)).expect_partial()
                except (tf.errors.OpError, OSError, ValueError) as exc:
                    # Pruned or replaced under us: the next poll sees a newer one.
                    progress.line(f"warning: checkpoint step {step} cannot be read "
                                  f"({first_line(exc, 200)}); waiting")
                else:
                    loss, accuracy = evaluate(model, dataset)
                    progress.eval(step, loss, accuracy)
                    writers.eval(step, loss=loss, accuracy=accuracy)
                    writers.sync()
                    last = step
                    if step >= config.train_steps:
                        progress.line(f"evaluator finished: step={step}")
                        return EXIT_OK
            if stop.wait(poll_seconds):
                progress.line(f"evaluator stopping: {stop.reason()}")
                return EXIT_OK
    finally:
        writers.close()
        store.close()


__all__ = ["evaluate", "run", "EVAL_BATCH_SIZE"]
