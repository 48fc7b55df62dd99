"""Event files as the trainer writes them, for the console's curves: TensorFlow's own
summary writer (`tf.summary`) writing `train/` and `eval/` with the trainer's tags
(`metrics/loss`, `metrics/accuracy`, `optimizer/learning_rate`, `speed/steps_per_sec`, a
`weights/` histogram). Written once into tests/golden/summaries/ (so that the default
tests need not start TensorFlow):

    python3 -m tests.support.summaries tests/golden/summaries

Values: train loss 2.3 * exp(-step / 400) + 0.3 and accuracy 1 - loss / 3 at steps 0,
100, ..., 1000; eval at 500 and 1000, 0.05 above train's loss.
"""
from __future__ import annotations

import math
import os
import shutil
import sys

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(__file__)), "golden", "summaries")
TRAIN_STEPS = list(range(0, 1001, 100))
EVAL_STEPS = [500, 1000]


def train_loss(step: int) -> float:
    return 2.3 * math.exp(-step / 400) + 0.3


def eval_loss(step: int) -> float:
    return train_loss(step) + 0.05


def write(folder: str) -> None:
    import numpy as np
    import tensorflow as tf
    shutil.rmtree(folder, ignore_errors=True)
    train = tf.summary.create_file_writer(os.path.join(folder, "train"))
    with train.as_default():
        for step in TRAIN_STEPS:
            loss = train_loss(step)
            tf.summary.scalar("metrics/loss", loss, step=step)
            tf.summary.scalar("metrics/accuracy", 1 - loss / 3, step=step)
            tf.summary.scalar("optimizer/learning_rate", 0.002, step=step)
            tf.summary.scalar("speed/steps_per_sec", 40.0, step=step)
            if step % 500 == 0:
                tf.summary.histogram("weights/dense/kernel",
                                     np.linspace(-1, 1, 64, dtype=np.float32), step=step)
    train.close()
    evals = tf.summary.create_file_writer(os.path.join(folder, "eval"))
    with evals.as_default():
        for step in EVAL_STEPS:
            tf.summary.scalar("metrics/loss", eval_loss(step), step=step)
            tf.summary.scalar("metrics/accuracy", 1 - eval_loss(step) / 3, step=step)
    evals.close()


if __name__ == "__main__":
    write(sys.argv[1] if len(sys.argv) > 1 else GOLDEN)
