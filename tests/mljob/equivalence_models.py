"""The equivalence suite's matrix: small models written the way keras.io writes them,
each compiled in its model_fn as a user would, and their data (deterministic).

A row is {optimizer, options, model, ...}: `batch_dependent` rows (BatchNormalization)
are compared with Keras's fit under the same strategy only, since each replica's batch
statistics are its own half batch's; `keras_distributes` False where Keras's own fit
cannot run the model under a MirroredStrategy (a GAN with no call).
"""
from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

N = 48
BATCH = 8  # the global batch of every run
STEPS = 6  # steps each run trains
OPTIMIZERS = {
    "sgd": lambda **o: keras.optimizers.SGD(0.05, **o),
    "nesterov": lambda **o: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True, **o),
    "adam": lambda **o: keras.optimizers.Adam(0.01, **o),
    "adamw": lambda **o: keras.optimizers.AdamW(0.01, **o),
    "rmsprop": lambda **o: keras.optimizers.RMSprop(0.01, **o),
    "adagrad": lambda **o: keras.optimizers.Adagrad(0.05, **o),
}
OPTIONS = {
    "none": {},
    "clipnorm": {"clipnorm": 0.05},
    "clipvalue": {"clipvalue": 0.01},
    "global_clipnorm": {"global_clipnorm": 0.05},
    "weight_decay": {"weight_decay": 0.1},
    "use_ema": {"use_ema": True, "ema_overwrite_frequency": 2},
    "gradient_accumulation_steps": {"gradient_accumulation_steps": 2},
}

# Every optimizer alone and with clipping and weight decay; SGD and Adam (the two update
# rules the others vary) with every option: 34 rows, where the whole cross would be 50
# (16 more rows of the slow step's time for options whose code path is the same).
CROSSED = ("sgd", "adam")
ROWS: dict[str, dict] = {
    f"{opt}-{option}": {"optimizer": opt, "options": option, "model": "dense"}
    for opt in OPTIMIZERS for option in OPTIONS
    if (opt in CROSSED or option in ("none", "clipnorm", "weight_decay"))
    and not (option == "weight_decay" and opt == "adamw")  # AdamW's own decay is "none"
}
ROWS.update({
    "regularized": {"optimizer": "sgd", "options": "none", "model": "regularized"},
    "sample_weights": {"optimizer": "sgd", "options": "none", "model": "dense",
                       "sample_weights": True},
    "class_weight": {"optimizer": "sgd", "options": "none", "model": "classifier",
                     "class_weight": {0: 0.3, 1: 2.0, 2: 1.0}},
    "two_outputs": {"optimizer": "nesterov", "options": "none", "model": "two_outputs"},
    "batchnorm": {"optimizer": "adam", "options": "none", "model": "batchnorm",
                  "batch_dependent": True},
    "custom_train_step": {"optimizer": "sgd", "options": "none", "model": "custom_step"},
    "lower_level": {"optimizer": "adam", "options": "none", "model": "lower_level"},
    "gan": {"optimizer": "adam", "options": "none", "model": "gan",
            "keras_distributes": False},
    "vae_add_loss": {"optimizer": "adam", "options": "none", "model": "vae"},
})


def data(row: str):
    """(x, y, sample_weight or None) of a row, the same every run."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(N, 4)).astype("float32")
    spec = ROWS[row]
    kind = spec["model"]
    if kind == "classifier":
        y = (np.argmax(x[:, :3], axis=1)).astype("int64")
    elif kind == "two_outputs":
        y = {"first": (x @ np.array([[1.], [2.], [3.], [4.]], "float32")),
             "second": (x[:, :2].sum(axis=1, keepdims=True) > 0).astype("float32")}
    elif kind in ("gan", "vae"):
        y = x
    else:
        y = x @ np.array([[1.], [2.], [3.], [4.]], "float32")
    w = rng.uniform(0.2, 2.0, size=(N,)).astype("float32") \
        if spec.get("sample_weights") else None
    return x, y, w


def _optimizer(row: str):
    spec = ROWS[row]
    return OPTIMIZERS[spec["optimizer"]](**OPTIONS[spec["options"]])


def _dense(regularizer=None):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((4,), name="x")
    hidden = keras.layers.Dense(6, activation="tanh", kernel_regularizer=regularizer,
                                name="hidden")(inputs)
    return inputs, hidden


class CustomModel(keras.Model):
    """keras.io's "Customizing what happens in fit()": its own train_step with
    compute_loss, its own tracker, and a counter only the step moves."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps_run = self.add_weight(shape=(), initializer="zeros", trainable=False,
                                         name="steps_run")
        self.mae_tracker = keras.metrics.MeanAbsoluteError(name="mae")

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        self.steps_run.assign_add(1.0)
        self.mae_tracker.update_state(y, y_pred)
        return {"loss": loss, "mae": self.mae_tracker.result()}

    @property
    def metrics(self):
        return [*super().metrics, self.mae_tracker]


class LowerLevel(keras.Model):
    """keras.io's "going lower-level": only an optimizer in compile, the loss written
    in train_step, a `metrics` property."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.loss_fn = keras.losses.MeanSquaredError()

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.loss_fn(y, self(x, training=True))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    def test_step(self, data):
        x, y = data
        self.loss_tracker.update_state(self.loss_fn(y, self(x, training=False)))
        return {"loss": self.loss_tracker.result()}

    @property
    def metrics(self):
        return [self.loss_tracker]


class GAN(keras.Model):
    """keras.io's GAN shape: two models, two optimizers (built in compile), a seeded
    noise source, its own trackers."""

    def __init__(self, discriminator, generator):
        super().__init__()
        self.discriminator, self.generator = discriminator, generator
        self.d_tracker = keras.metrics.Mean(name="d_loss")
        self.g_tracker = keras.metrics.Mean(name="g_loss")

    def compile(self, d_optimizer, g_optimizer):
        super().compile(optimizer=d_optimizer)
        self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer
        self.g_optimizer.build(self.generator.trainable_variables)
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    @property
    def metrics(self):
        return [self.d_tracker, self.g_tracker]

    def train_step(self, data):
        real = data[0] if isinstance(data, tuple) else data
        batch = tf.shape(real)[0]
        # Noise from the data (deterministic in every mode): the point is the two updates.
        z = tf.tanh(real[:, :2] * 0.5)
        fake = self.generator(z)
        both = tf.concat([fake, real], 0)
        labels = tf.concat([tf.ones((batch, 1)), tf.zeros((batch, 1))], 0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(both))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(tf.zeros((batch, 1)),
                                  self.discriminator(self.generator(z)))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_tracker.update_state(d_loss)
        self.g_tracker.update_state(g_loss)
        return {"d_loss": self.d_tracker.result(), "g_loss": self.g_tracker.result()}


class KLLoss(keras.layers.Layer):
    """A VAE's KL term, added with add_loss (keras.io's older VAE)."""

    def call(self, inputs):
        mean, log_var = inputs
        self.add_loss(-0.5 * tf.reduce_mean(1 + log_var - tf.square(mean)
                                            - tf.exp(log_var)))
        return mean


def model_fn(row: str):
    spec = ROWS[row]
    kind = spec["model"]

    def build():
        if kind in ("dense", "regularized"):
            inputs, hidden = _dense(keras.regularizers.L2(0.05) if kind == "regularized"
                                    else None)
            model = keras.Model(inputs, keras.layers.Dense(1, name="out")(hidden))
            model.compile(optimizer=_optimizer(row), loss="mse")
        elif kind == "classifier":
            inputs, hidden = _dense()
            model = keras.Model(inputs, keras.layers.Dense(3, name="out")(hidden))
            model.compile(optimizer=_optimizer(row),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        elif kind == "two_outputs":
            inputs, hidden = _dense()
            model = keras.Model(inputs, {
                "first": keras.layers.Dense(1, name="first")(hidden),
                "second": keras.layers.Dense(1, activation="sigmoid", name="second")(hidden)})
            model.compile(optimizer=_optimizer(row),
                          loss={"first": "mse", "second": "binary_crossentropy"},
                          loss_weights={"first": 0.3, "second": 2.0})
        elif kind == "batchnorm":
            inputs, hidden = _dense()
            normed = keras.layers.BatchNormalization(name="bn")(hidden)
            model = keras.Model(inputs, keras.layers.Dense(1, name="out")(normed))
            model.compile(optimizer=_optimizer(row), loss="mse")
        elif kind in ("custom_step", "lower_level"):
            inputs, hidden = _dense()
            cls = CustomModel if kind == "custom_step" else LowerLevel
            model = cls(inputs, keras.layers.Dense(1, name="out")(hidden))
            if kind == "custom_step":
                model.compile(optimizer=_optimizer(row), loss="mse")
            else:
                model.compile(optimizer=_optimizer(row))
        elif kind == "gan":
            keras.utils.set_random_seed(3)
            discriminator = keras.Sequential([keras.Input((4,)),
                                              keras.layers.Dense(5, activation="relu"),
                                              keras.layers.Dense(1)], name="discriminator")
            generator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4)],
                                         name="generator")
            model = GAN(discriminator, generator)
            model.compile(_optimizer(row), _optimizer(row))
        elif kind == "vae":
            keras.utils.set_random_seed(3)
            inputs = keras.Input((4,), name="x")
            hidden = keras.layers.Dense(6, activation="tanh", name="enc")(inputs)
            mean = keras.layers.Dense(2, name="mean")(hidden)
            log_var = keras.layers.Dense(2, name="log_var")(hidden)
            z = KLLoss(name="kl")([mean, log_var])
            outputs = keras.layers.Dense(4, name="dec")(z)
            model = keras.Model(inputs, outputs)
            model.compile(optimizer=_optimizer(row), loss="mse")
        else:
            raise AssertionError(kind)
        return model
    return build


__all__ = ["ROWS", "OPTIMIZERS", "OPTIONS", "data", "model_fn"]
