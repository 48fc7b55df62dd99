"""The seeds' two models as plain Keras 3 layers: the CNN and the one-hidden-layer MLP.

Both take float32 [B, 784] pixel values in [0, 1] and return logits [B, 10]; the CNN
reshapes to 28x28x1 inside, so the input pipeline, the serving signature and the
predictor deal in one shape whatever the model. Nothing here knows about strategies:
`build` creates its variables in whatever scope it is called from (a
ParameterServerStrategy scope places and shards them; the export builds outside any).
"""
from __future__ import annotations

import functools

import keras

from trainer.errors import UsageError

MODELS = ("cnn", "mlp")
# --mixed-precision: "off" keeps every layer float32; "mixed_bfloat16" computes in
# bfloat16 with float32 variables (so checkpoints and the export do not change).
PRECISIONS = ("off", "mixed_bfloat16")
IMAGE_PIXELS = 28 * 28
NUM_CLASSES = 10


def build(name: str, *, dropout: float = 0.4, seed: int | None = None,
          precision: str = "off", hidden_units: int | None = None) -> keras.Model:
    """A fresh, built model: float32 [B, 784] -> float32 logits [B, 10].

    seed makes the initial weights and the dropout masks reproducible; each layer gets
    its own derived seed so the two conv layers do not start from the same kernel.
    hidden_units is the width of the fully connected hidden layer (None: the original
    samples' 1024 for the CNN, 100 for the MLP); the MLP gets a dropout layer only when
    dropout is above 0, so its default stays the original samples' model.
    precision (one of PRECISIONS) is given to the layers as their dtype policy rather
    than set globally, so it cannot leak into other models of the process (the export's
    fresh float32 model). The logits layer stays float32 either way: the softmax
    cross-entropy is unstable in bfloat16.
    """
    if name not in MODELS:
        raise UsageError(f"unknown model {name!r}; "
                         f"use --model with one of {', '.join(MODELS)}")
    if not 0.0 <= dropout < 1.0:
        raise UsageError(f"--dropout must be in [0, 1), got {dropout}; "
                         "pass e.g. --dropout 0.4")
    if precision not in PRECISIONS:
        raise UsageError(f"unknown mixed precision {precision!r}; "
                         f"use --mixed-precision with one of {', '.join(PRECISIONS)}")
    seeds = _SeedSequence(seed)
    dtype = None if precision == "off" else precision  # None: Keras's float32 default
    image = keras.Input(shape=(IMAGE_PIXELS,), dtype="float32", name="image")
    if name == "cnn":
        logits = _cnn(image, dropout, seeds, dtype, hidden_units or 1024)
    else:
        logits = _mlp(image, seeds, dtype, hidden_units or 100, dropout)
    return keras.Model(inputs=image, outputs=logits, name=name)


def _cnn(image, dropout: float, seeds: "_SeedSequence", dtype, units: int):
    """The seeds' convolutional model (TensorFlow's 'Deep MNIST for experts')."""
    x = keras.layers.Reshape((28, 28, 1), name="to_grid", dtype=dtype)(image)
    x = keras.layers.Conv2D(32, 5, padding="same", activation="relu", name="conv1",
                            kernel_initializer=seeds.glorot(), dtype=dtype)(x)
    x = keras.layers.MaxPooling2D(2, name="pool1", dtype=dtype)(x)
    x = keras.layers.Conv2D(64, 5, padding="same", activation="relu", name="conv2",
                            kernel_initializer=seeds.glorot(), dtype=dtype)(x)
    x = keras.layers.MaxPooling2D(2, name="pool2", dtype=dtype)(x)
    x = keras.layers.Flatten(name="flatten", dtype=dtype)(x)
    x = keras.layers.Dense(units, activation="relu", name="dense1",
                           kernel_initializer=seeds.glorot(), dtype=dtype)(x)
    x = keras.layers.Dropout(dropout, seed=seeds.next(), name="dropout", dtype=dtype)(x)
    return keras.layers.Dense(NUM_CLASSES, name="logits", dtype="float32",
                              kernel_initializer=seeds.glorot())(x)


def _mlp(image, seeds: "_SeedSequence", dtype, units: int, dropout: float):
    """The seeds' MLP: 784 -> 100 sigmoid -> 10 (units and dropout tunable)."""
    x = keras.layers.Dense(units, activation="sigmoid", name="hidden",
                           kernel_initializer=seeds.glorot(), dtype=dtype)(image)
    if dropout > 0:
        x = keras.layers.Dropout(dropout, seed=seeds.next(), name="dropout",
                                 dtype=dtype)(x)
    return keras.layers.Dense(NUM_CLASSES, name="logits", dtype="float32",
                              kernel_initializer=seeds.glorot())(x)


class _SeedSequence:
    """Distinct per-layer seeds from one job seed (None: unseeded, Keras's own)."""

    def __init__(self, seed: int | None):
        self._seed = seed
        self._count = 0

    def next(self) -> int | None:
        if self._seed is None:
            return None
        self._count += 1
        return (self._seed * 1_000_003 + self._count) % (2**31 - 1)

    def glorot(self) -> keras.initializers.Initializer:
        return keras.initializers.GlorotUniform(seed=self.next())


@functools.cache
def _shapes(name: str) -> tuple[tuple[int, ...], ...]:
    """The shapes of the model's weights, in `get_weights()` order (built once)."""
    return tuple(tuple(w.shape) for w in build(name).weights)


def num_parameters(name: str) -> int:
    """How many scalars the model's weights hold (3,274,634 for cnn, 79,510 for mlp)."""
    total = 0
    for shape in _shapes(name):
        size = 1
        for dim in shape:
            size *= dim
        total += size
    return total


def weights_bytes(name: str) -> int:
    """Bytes of the model's float32 weights: what one full pull or push of the
    variables between a worker and the parameter servers moves."""
    return 4 * num_parameters(name)


__all__ = ["MODELS", "PRECISIONS", "IMAGE_PIXELS", "NUM_CLASSES", "build",
           "num_parameters", "weights_bytes"]
