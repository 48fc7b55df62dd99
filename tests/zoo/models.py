"""The model zoo: eleven models written the way keras.io's examples write them, each with
its own small synthetic data (a learnable rule), trained by `mljob.training` in the zoo's
tests. Some return a compiled model (loss, metrics and optimizer from `compile`), some
give them to `fit`; what Keras would do is the reference for both.

Each `Entry` has: `model_fn` (a fresh model), `data(n, seed)` -> (features, labels[,
sample_weight]) as numpy, `fit` (the extra arguments of `training.fit`), `serving` (the
export's signature; None: the model's own Input layers), `reference(model)` (the model
compiled as Keras would run it, for `model.evaluate`) and `ps` (how many parameter
servers its cluster run uses).

Run as `python -m tests.zoo.models NAME --job-dir D [--train-steps N]` under any TF_CONFIG
(the cluster tests): `mljob.training.main` takes the role.
"""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from mljob import training  # before TensorFlow: it sets GRPC_FAIL_FAST

import keras
import tensorflow as tf

WORDS = ["good", "great", "fine", "bad", "awful", "poor", "the", "a", "movie", "plot"]
CITIES = ["paris", "tokyo", "lima", "oslo", "cairo"]


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    model_fn: Callable[[], Any]
    data: Callable[[int, int], tuple]
    fit: Callable[[], dict] = dict  # made when a run starts: metrics hold variables
    serving: Any = None
    reference: Callable[[Any], Any] | None = None  # compiles a model as fit ran it
    ps: int = 1
    tolerance: float = 1e-5
    input: str = ""  # a single-input model's input name (its features are one array)


def _compiled(**compile_args):
    def reference(model):
        model.compile(**{k: v() if callable(v) and k in ("metrics", "loss") else v
                         for k, v in compile_args.items()})
        return model
    return reference


# ---- 1. structured data: census-style columns through preprocessing layers -----------

def _census_data(n, seed):
    rng = np.random.default_rng(seed)
    age = rng.uniform(18, 80, n).astype(np.float32)
    hours = rng.normal(40, 10, n).astype(np.float32)
    city = rng.choice(CITIES, n)
    children = rng.integers(0, 5, n).astype(np.int64)
    occupation = rng.choice([f"job{i}" for i in range(30)], n)
    score = (age - 45) / 15 + (hours - 40) / 10 + (city == "oslo") * 1.5 - (children > 2)
    label = (score + rng.normal(0, 0.3, n) > 0).astype(np.float32)
    return {"age": age, "hours": hours, "city": city, "children": children,
            "occupation": occupation}, label


def _census_model():
    x, _ = _census_data(500, 99)
    age = keras.Input((), name="age")
    hours = keras.Input((), name="hours")
    city = keras.Input((), dtype="string", name="city")
    children = keras.Input((), dtype="int64", name="children")
    occupation = keras.Input((), dtype="string", name="occupation")
    numeric = keras.layers.Normalization(axis=-1, name="numeric_norm")
    numeric.adapt(np.stack([x["age"], x["hours"]], axis=1))
    num = numeric(keras.ops.stack([age, hours], axis=1))
    city_ids = keras.layers.StringLookup(vocabulary=CITIES, output_mode="one_hot",
                                         name="city_lookup")(city)
    child_ids = keras.layers.IntegerLookup(vocabulary=[0, 1, 2, 3, 4],
                                           output_mode="one_hot", name="children_lookup")(
        children)
    hashed = keras.layers.Hashing(num_bins=16, output_mode="one_hot",
                                  name="occupation_hash")(
        keras.ops.expand_dims(occupation, -1))
    h = keras.layers.Concatenate()([num, city_ids, child_ids, hashed])
    h = keras.layers.Dense(16, activation="relu")(h)
    h = keras.layers.Dropout(0.1)(h)
    out = keras.layers.Dense(1, activation="sigmoid", name="income")(h)
    model = keras.Model({"age": age, "hours": hours, "city": city, "children": children,
                         "occupation": occupation}, out, name="census")
    model.compile(optimizer=keras.optimizers.Adam(0.02),
                  loss=keras.losses.BinaryCrossentropy(),
                  metrics=["accuracy", keras.metrics.AUC(name="auc"),
                           keras.metrics.Precision(name="precision"),
                           keras.metrics.Recall(name="recall")])
    return model


# ---- 2. text: TextVectorization on raw strings, from logits ---------------------------

def _text_data(n, seed):
    rng = np.random.default_rng(seed)
    good, bad = WORDS[:3], WORDS[3:6]
    label = rng.integers(0, 2, n).astype(np.float32)
    texts = []
    for y in label:
        words = list(rng.choice(WORDS[6:], rng.integers(2, 6)))
        words += list(rng.choice(good if y else bad, rng.integers(1, 3)))
        rng.shuffle(words)
        texts.append(" ".join(words).title() + "!")
    return np.array(texts), label


def _text_model():
    texts, _ = _text_data(300, 98)
    vectorize = keras.layers.TextVectorization(max_tokens=50, output_sequence_length=12,
                                               name="vectorize")
    vectorize.adapt(texts)
    text = keras.Input((), dtype="string", name="text")
    x = keras.layers.Embedding(50, 8, mask_zero=True)(vectorize(text))
    x = keras.layers.GlobalAveragePooling1D()(x)
    logit = keras.layers.Dense(1, name="logit")(x)
    return keras.Model(text, logit, name="text")


# ---- 3. images: augmentation (training only), Rescaling, BatchNormalization ------------

def _image_data(n, seed):
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 3, n).astype(np.int64)
    images = rng.integers(0, 60, (n, 8, 8, 1)).astype(np.float32)
    for i, y in enumerate(label):  # a bright band: top rows, middle rows or bottom rows
        images[i, 1 + 2 * y:3 + 2 * y, :, 0] += 180
    return images, label


def _image_model():
    image = keras.Input((8, 8, 1), name="pixels")
    x = keras.layers.RandomFlip("horizontal", seed=1)(image)
    x = keras.layers.RandomContrast(0.1, seed=2)(x)
    x = keras.layers.Rescaling(1 / 255)(x)
    x = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(x)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Activation("relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    out = keras.layers.Dense(3, activation="softmax", name="probabilities")(x)
    model = keras.Model(image, out, name="image")
    model.compile(optimizer=keras.optimizers.Adam(0.03),
                  loss="sparse_categorical_crossentropy",
                  metrics=["accuracy",
                           keras.metrics.MeanIoU(num_classes=3, sparse_y_pred=False,
                                                 name="iou")])
    return model


# ---- 4. multi-input, multi-output: a loss per output, weights, metrics per output ----

def _ticket_data(n, seed):
    rng = np.random.default_rng(seed)
    body = rng.normal(size=(n, 6)).astype(np.float32)
    tag = rng.integers(0, 4, n).astype(np.int64)
    priority = (body[:, 0] + 0.5 * tag).astype(np.float32)[:, None]
    department = ((body[:, 1] > 0).astype(np.int64) + 2 * (tag > 1)).astype(np.int64)
    return {"body": body, "tag": tag}, {"priority": priority, "department": department}


def _ticket_model():
    body = keras.Input((6,), name="body")
    tag = keras.Input((), dtype="int64", name="tag")
    t = keras.layers.Embedding(4, 3)(tag)
    h = keras.layers.Concatenate()([body, t])
    h = keras.layers.Dense(16, activation="relu")(h)
    priority = keras.layers.Dense(1, name="priority")(h)
    department = keras.layers.Dense(4, activation="softmax", name="department")(h)
    model = keras.Model({"body": body, "tag": tag},
                        {"priority": priority, "department": department}, name="tickets")
    model.compile(optimizer=keras.optimizers.Adam(0.02),
                  loss={"priority": "mse", "department": "sparse_categorical_crossentropy"},
                  loss_weights={"priority": 1.0, "department": 0.5},
                  metrics={"priority": ["mae"], "department": ["accuracy"]})
    return model


# ---- 5. regression with sample weights from the dataset ------------------------------

def _regression_data(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(3, 2, size=(n, 5)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 0.0, 3.0], np.float32) + 1).astype(np.float32)
    weight = rng.uniform(0.5, 2.0, n).astype(np.float32)
    return x, y[:, None], weight


def _regression_model():
    x, _, _ = _regression_data(400, 97)
    inputs = keras.Input((5,), name="x")
    norm = keras.layers.Normalization(name="norm")
    norm.adapt(x)
    h = keras.layers.Dense(16, activation="relu",
                           kernel_regularizer=keras.regularizers.L2(1e-4))(norm(inputs))
    return keras.Model(inputs, keras.layers.Dense(1, name="y")(h), name="regression")


# ---- 6. multi-label --------------------------------------------------------------------

def _multilabel_data(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    y = np.stack([x[:, 0] > 0, x[:, 1] + x[:, 2] > 0, x[:, 3] < -0.5], 1).astype(np.float32)
    return x, y


def _multilabel_model():
    inputs = keras.Input((8,), name="features")
    h = keras.layers.Dense(16, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(3, activation="sigmoid", name="tags")(h),
                       name="multilabel")


# ---- 7. variable-length sequences, padded and masked -----------------------------------

def _sequence_data(n, seed):
    rng = np.random.default_rng(seed)
    tokens = np.zeros((n, 10), np.int64)
    label = np.zeros(n, np.int64)
    for i in range(n):
        length = rng.integers(2, 11)
        tokens[i, :length] = rng.integers(1, 20, length)
        label[i] = int((tokens[i, :length] >= 10).mean() > 0.5)
    return tokens, label


def _sequence_model():
    tokens = keras.Input((None,), dtype="int64", name="tokens")
    x = keras.layers.Embedding(20, 8, mask_zero=True)(tokens)
    x = keras.layers.GRU(8)(x)
    model = keras.Model(tokens, keras.layers.Dense(2, name="logits")(x), name="sequence")
    model.compile(optimizer=keras.optimizers.Adam(0.02),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


# ---- 8. a subclassed model with its own state ------------------------------------------

class RunningCenter(keras.layers.Layer):
    """Centres its input by a running mean it keeps (a non-trainable weight updated in
    training, like BatchNormalization's) and looks its colour column up in its own
    tf.lookup table (a resource, not a variable)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(["red", "green", "blue"], [1.0, 2.0, 3.0]),
            default_value=0.0)

    def build(self, input_shape):
        self.mean = self.add_weight(shape=(input_shape["x"][-1],), initializer="zeros",
                                    trainable=False, name="running_mean")
        self.seen = self.add_weight(shape=(), initializer="zeros", trainable=False,
                                    name="batches_seen")

    def call(self, inputs, training=False):
        x = inputs["x"]
        if training:
            self.mean.assign(0.9 * self.mean + 0.1 * keras.ops.mean(x, axis=0))
            self.seen.assign_add(1.0)
        colour = self.table.lookup(inputs["colour"])[:, None]
        return keras.ops.concatenate([x - self.mean, colour], axis=-1)


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__(name="subclassed")
        self.center = RunningCenter()
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.out = keras.layers.Dense(1)

    def call(self, inputs, training=False):
        return self.out(self.hidden(self.center(inputs, training=training)))


def _subclassed_data(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(2, 1, size=(n, 3)).astype(np.float32)
    colour = rng.choice(["red", "green", "blue"], n)
    y = (x[:, 0] - x[:, 1] + (colour == "blue") * 2).astype(np.float32)[:, None]
    return {"x": x, "colour": colour}, y


def _subclassed_model():
    model = Subclassed()
    model({"x": tf.zeros([1, 3]), "colour": tf.constant(["red"])})
    return model


# ---- 9. an embedding big enough to be sharded over two ps ------------------------------

BIG_VOCAB = 20000  # 20000 x 16 float32: 1.25 MiB, over MIN_SHARD_BYTES: split over 2 ps


def _big_embedding_data(n, seed):
    rng = np.random.default_rng(seed)
    item = rng.integers(0, BIG_VOCAB, n).astype(np.int64)
    return item, (item % 2).astype(np.int64)


def _big_embedding_model():
    item = keras.Input((), dtype="int64", name="item")
    x = keras.layers.Embedding(BIG_VOCAB, 16, name="items")(item)
    return keras.Model(item, keras.layers.Dense(2, activation="softmax", name="p")(x),
                       name="big_embedding")


# ---- 10. mixed precision ---------------------------------------------------------------

def _mixed_model():
    inputs = keras.Input((8,), name="features")
    h = keras.layers.Dense(32, activation="relu", dtype="mixed_bfloat16")(inputs)
    h = keras.layers.Dense(32, activation="relu", dtype="mixed_bfloat16")(h)
    out = keras.layers.Dense(3, activation="softmax", dtype="float32", name="p")(h)
    model = keras.Model(inputs, out, name="mixed")
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss="sparse_categorical_crossentropy",
                  metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(
                      k=2, name="top2")])
    return model


def _mixed_data(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    return x, np.argmax(x[:, :3], axis=1).astype(np.int64)


# ---- 11. imbalanced classes with class_weight -------------------------------------------

def _imbalanced_data(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    positive = (x[:, 0] + 0.3 * x[:, 1] > 1.2).astype(np.int64)  # about 12% positive
    return x, np.eye(2, dtype=np.float32)[positive]  # one-hot, as F1Score takes


def _imbalanced_model():
    inputs = keras.Input((4,), name="features")
    h = keras.layers.Dense(8, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax", name="p")(h),
                       name="imbalanced")


ZOO: dict[str, Entry] = {e.name: e for e in [
    Entry("census", model_fn=_census_model, data=_census_data, reference=lambda m: m),
    Entry("text", input="text", model_fn=_text_model, data=_text_data,
          fit=lambda: dict(loss=keras.losses.BinaryCrossentropy(from_logits=True),
                   optimizer=lambda: keras.optimizers.Adam(0.05), metrics=["accuracy"]),
          # Keras would threshold the logits at 0.5; the library at 0 (sigmoid 0.5).
          reference=_compiled(loss=lambda: keras.losses.BinaryCrossentropy(from_logits=True),
                              metrics=lambda: [keras.metrics.BinaryAccuracy(
                                  name="accuracy", threshold=0.0)])),
    Entry("image", input="pixels", model_fn=_image_model, data=_image_data,
          reference=lambda m: m),
    Entry("tickets", model_fn=_ticket_model, data=_ticket_data, reference=lambda m: m),
    Entry("regression", input="x", model_fn=_regression_model, data=_regression_data,
          fit=lambda: dict(loss="mse", optimizer=lambda: keras.optimizers.Adam(0.03),
                   metrics=["mae", keras.metrics.RootMeanSquaredError(name="rmse")]),
          reference=_compiled(loss="mse", metrics=lambda: [
              "mae", keras.metrics.RootMeanSquaredError(name="rmse")])),
    Entry("multilabel", input="features", model_fn=_multilabel_model, data=_multilabel_data,
          fit=lambda: dict(loss="binary_crossentropy",
                           optimizer=lambda: keras.optimizers.Adam(0.03),
                   metrics=["binary_accuracy", keras.metrics.AUC(multi_label=True, name="auc"),
                            keras.metrics.Precision(name="precision"),
                            keras.metrics.Recall(name="recall")]),
          reference=_compiled(loss="binary_crossentropy", metrics=lambda: [
              "binary_accuracy", keras.metrics.AUC(multi_label=True, name="auc"),
              keras.metrics.Precision(name="precision"),
              keras.metrics.Recall(name="recall")])),
    Entry("sequence", input="tokens", model_fn=_sequence_model, data=_sequence_data,
          reference=lambda m: m),
    Entry("subclassed", model_fn=_subclassed_model, data=_subclassed_data,
          fit=lambda: dict(loss="mse", optimizer="adam", metrics=["mae"]),
          serving=training.Serving(inputs={"x": tf.TensorSpec([None, 3], tf.float32),
                                           "colour": tf.TensorSpec([None], tf.string)}),
          reference=_compiled(loss="mse", metrics=lambda: ["mae"])),
    Entry("big_embedding", input="item", model_fn=_big_embedding_model, data=_big_embedding_data,
          fit=lambda: dict(loss="sparse_categorical_crossentropy", optimizer=lambda:
                   keras.optimizers.Adam(0.05), metrics=["accuracy"]),
          reference=_compiled(loss="sparse_categorical_crossentropy",
                              metrics=lambda: ["accuracy"]), ps=2),
    Entry("mixed", input="features", model_fn=_mixed_model, data=_mixed_data,
          reference=lambda m: m, tolerance=2e-2),
    Entry("imbalanced", input="features", model_fn=_imbalanced_model, data=_imbalanced_data,
          fit=lambda: dict(loss="categorical_crossentropy",
                   optimizer=lambda: keras.optimizers.Adam(0.05),
                   metrics=["accuracy", keras.metrics.F1Score(average="macro", name="f1")],
                   class_weight={0: 1.0, 1: 6.0}),
          reference=_compiled(loss="categorical_crossentropy", metrics=lambda: [
              "accuracy", keras.metrics.F1Score(average="macro", name="f1")])),
]}


def entry_data(entry: Entry, n: int, seed: int) -> tuple:
    return entry.data(n, seed)


def as_inputs(entry: Entry, features) -> dict:
    """Features by the export's input names."""
    return dict(features) if isinstance(features, dict) else {entry.input: features}


def dataset(entry: Entry, n: int, seed: int, batch: int, *, repeat: bool = False,
            shard: tuple | None = None):
    ds = tf.data.Dataset.from_tensor_slices(entry.data(n, seed))
    if shard is not None:
        ds = ds.shard(*shard)
    if repeat:
        ds = ds.shuffle(n, seed=seed).repeat()
    return ds.batch(batch, drop_remainder=repeat)


def fit_arguments(entry: Entry, *, train_n: int = 512, eval_n: int = 256) -> dict:
    """What the zoo's runs give `training.fit` besides the config."""
    def train_dataset_fn(context):
        return dataset(entry, train_n, 0, context.batch_size, repeat=True,
                       shard=(context.num_input_pipelines, context.input_pipeline_id))

    def eval_dataset_fn():
        return dataset(entry, eval_n, 1, 64)

    serving = entry.serving or training.Serving()
    return dict(train_dataset_fn=train_dataset_fn, eval_dataset_fn=eval_dataset_fn,
                serving=serving, describe=f"model={entry.name}", **entry.fit())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("name", choices=sorted(ZOO))
    p.add_argument("--job-dir", required=True)
    p.add_argument("--train-steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()
    entry = ZOO[args.name]
    kwargs = fit_arguments(entry)
    training.main(entry.model_fn, kwargs.pop("train_dataset_fn"), **kwargs,
                  config=training.RunConfig(job_dir=args.job_dir,
                                            train_steps=args.train_steps,
                                            batch_size=args.batch_size, eval_every=0,
                                            checkpoint_every=0, log_every=10,
                                            steps_per_execution=5))


if __name__ == "__main__":
    main()
