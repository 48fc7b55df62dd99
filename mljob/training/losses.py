"""The user's loss and metrics as per-example functions `(labels, outputs) -> [batch]`.

The loop averages them itself: the loss over the global batch (so replicas' gradients
add up to the mean, `tf.nn.compute_average_loss`), the metrics over each batch in
training and over every example in evaluation. So a Keras loss object is called without
its reduction, and a metric is given as a per-example function or a known name.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from mljob.training.errors import UsageError

PerExample = Callable[[Any, Any], Any]


def _accuracy(labels, outputs):
    """Sparse categorical accuracy: the arg-max of the outputs (logits or
    probabilities) equals the integer label."""
    predicted = tf.argmax(outputs, axis=-1, output_type=tf.int64)
    return tf.cast(tf.equal(predicted, tf.cast(tf.reshape(labels, tf.shape(predicted)),
                                               tf.int64)), tf.float32)


def _binary_accuracy(labels, outputs):
    """Outputs are one logit per example: positive means class 1."""
    outputs = tf.reshape(outputs, [-1])
    return tf.cast(tf.equal(tf.cast(outputs > 0, tf.int64),
                            tf.cast(tf.reshape(labels, [-1]), tf.int64)), tf.float32)


def _absolute_error(labels, outputs):
    outputs = tf.reshape(tf.cast(outputs, tf.float32), [tf.shape(outputs)[0], -1])
    labels = tf.reshape(tf.cast(labels, tf.float32), tf.shape(outputs))
    return tf.reduce_mean(tf.abs(outputs - labels), axis=-1)


METRICS: dict[str, PerExample] = {"accuracy": _accuracy,
                                  "binary_accuracy": _binary_accuracy,
                                  "mae": _absolute_error}


def per_example_loss(loss) -> PerExample:
    """A `keras.losses.Loss` (its reduction skipped), a Keras loss name, or a function."""
    if isinstance(loss, keras.losses.Loss):
        return loss.call
    if isinstance(loss, str):
        try:
            fn = keras.losses.get(loss)
        except ValueError:
            raise UsageError(f"unknown loss {loss!r}; give a Keras loss name, a "
                             "keras.losses.Loss or a function (labels, outputs) -> "
                             "per-example losses") from None
        return fn.call if isinstance(fn, keras.losses.Loss) else fn
    if callable(loss):
        return loss
    raise UsageError(f"loss must be a Keras loss or a function (labels, outputs) -> "
                     f"per-example losses, not {type(loss).__name__}")


def metric_functions(metrics: Mapping[str, Any] | Sequence[Any]) -> dict[str, PerExample]:
    """{name: per-example function}, in the order given."""
    if isinstance(metrics, Mapping):
        pairs = list(metrics.items())
    else:
        pairs = [(m, m) if isinstance(m, str) else (getattr(m, "__name__", ""), m)
                 for m in metrics]
    out: dict[str, PerExample] = {}
    for name, fn in pairs:
        if isinstance(fn, str):
            if fn not in METRICS:
                raise UsageError(f"unknown metric {fn!r}; use one of "
                                 f"{', '.join(METRICS)}, or {{name: function (labels, "
                                 "outputs) -> per-example values}")
            fn = METRICS[fn]
        if not name or not callable(fn) or name == "loss" or "/" in name:
            raise UsageError(f"metric {name!r}: give metrics as names or {{name: "
                             "function}}; a name other than 'loss', without '/'")
        out[name] = fn
    return out


__all__ = ["per_example_loss", "metric_functions", "METRICS"]
