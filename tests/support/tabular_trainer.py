"""A user's own trainer on mljob's training library: neither the bundled CNN nor the MLP
but a small tabular classifier (four numeric columns and one categorical column through
an embedding, three classes) on an .npz the test generates (`make_data`).

Run as `python -m tests.support.tabular_trainer --data F --job-dir D ...` under any
TF_CONFIG; `mljob.training.main` takes the role, the exit status and the messages.
"""
from __future__ import annotations

import argparse

import numpy as np

from mljob import training  # before TensorFlow: it sets GRPC_FAIL_FAST

NUMERIC, CATEGORIES, CLASSES = 4, 5, 3


def make_data(path, n: int = 4000, seed: int = 0) -> dict:
    """n examples whose class is a fixed linear rule of the columns; saved to path."""
    rng = np.random.default_rng(seed)
    num = rng.normal(size=(n, NUMERIC)).astype(np.float32)
    cat = rng.integers(0, CATEGORIES, size=n).astype(np.int64)
    weights = np.array([[2.0, -1.0, 0.0], [0.0, 2.0, -1.0], [-1.0, 0.0, 2.0],
                        [1.0, 1.0, -2.0]], np.float32)
    offsets = np.array([[1.5, 0, 0], [0, 1.5, 0], [0, 0, 1.5], [0, 0, 0], [-1.5, 0, 0]],
                       np.float32)
    label = np.argmax(num @ weights + offsets[cat], axis=1).astype(np.int64)
    arrays = {"num": num, "cat": cat, "label": label}
    np.savez(path, **arrays)
    return arrays


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--job-dir", required=True)
    p.add_argument("--train-steps", type=int, default=300)
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--steps-per-execution", type=int, default=10)
    args = p.parse_args()

    import keras
    import tensorflow as tf

    def build_model():
        num = keras.Input(shape=(NUMERIC,), dtype="float32", name="num")
        cat = keras.Input(shape=(), dtype="int64", name="cat")
        embedded = keras.layers.Embedding(CATEGORIES, 3, name="cat_embedding")(cat)
        x = keras.layers.Concatenate(name="columns")([num, embedded])
        x = keras.layers.Dense(32, activation="relu", name="hidden")(x)
        logits = keras.layers.Dense(CLASSES, name="logits")(x)
        return keras.Model({"num": num, "cat": cat}, logits, name="tabular")

    def columns(arrays):
        return {"num": arrays["num"], "cat": arrays["cat"]}, arrays["label"]

    def train_dataset_fn(context):
        arrays = dict(np.load(args.data))
        ds = tf.data.Dataset.from_tensor_slices(columns(arrays))
        ds = ds.shard(context.num_input_pipelines, context.input_pipeline_id)
        ds = ds.shuffle(len(arrays["label"]), seed=context.seed).repeat()
        return ds.batch(context.batch_size, drop_remainder=True)

    def eval_dataset_fn():
        return tf.data.Dataset.from_tensor_slices(columns(dict(np.load(args.data)))).batch(500)

    serving = training.Serving(
        inputs={"num": tf.TensorSpec([None, NUMERIC], tf.float32),
                "cat": tf.TensorSpec([None], tf.int64)},
        outputs=lambda logits: {"probabilities": tf.nn.softmax(logits),
                                "class": tf.argmax(logits, axis=1)})
    training.main(
        build_model, train_dataset_fn, eval_dataset_fn=eval_dataset_fn,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=lambda: keras.optimizers.Adam(0.01), metrics=["accuracy"],
        serving=serving, describe="model=tabular",
        config=training.RunConfig(job_dir=args.job_dir, train_steps=args.train_steps,
                                  batch_size=50, checkpoint_every=args.checkpoint_every,
                                  eval_every=args.eval_every, log_every=args.log_every,
                                  steps_per_execution=args.steps_per_execution, seed=1))


if __name__ == "__main__":
    main()
