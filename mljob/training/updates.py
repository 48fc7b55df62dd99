"""Adam's update fused by XLA, for the single node and for local steps under ps.

Keras applies Adam op by op: each weight tensor is read and written about twelve times
a step (the two moments, their bias corrections, the step). XLA fuses each tensor's
update into one pass over it. Under ps local steps it cut the CNN worker's step from
45-58 CPU-ms to 34-37 in mixed bfloat16 (bench/local_update.py). On a single node,
Keras's own train_step runs with its optimizer's `apply_gradients` replaced by this
update (`fuse`) where it is exactly Keras's: side by side on the default CNN job,
Keras's op-by-op Adam took about 10% more CPU per step (bench/README.md, section 14).

`fusable` says when the fused update is exactly Keras's: plain Adam with none of the
optimizer's extras (weight decay, clipping, EMA, gradient accumulation, loss scaling)
and no variable constraints; anything else keeps `optimizer.apply_gradients`.
"""
from __future__ import annotations

import keras
import tensorflow as tf

from mljob.training.keras_private import adam_slots


@tf.function(jit_compile=True, autograph=False)
def adam_step(weights, ms, vs, grads, alpha, b1, b2, eps):
    """Keras's Adam update of lists of tensors: (weights, first moments, second
    moments) after one step with step size alpha."""
    ms = [m + (g - m) * (1 - b1) for m, g in zip(ms, grads, strict=True)]
    vs = [v + (tf.square(g) - v) * (1 - b2) for v, g in zip(vs, grads, strict=True)]
    weights = [w - m * alpha / (tf.sqrt(v) + eps)
               for w, m, v in zip(weights, ms, vs, strict=True)]
    return weights, ms, vs


def fusable(optimizer, variables) -> bool:
    """Whether `apply_adam` computes exactly what `optimizer.apply_gradients` would."""
    if type(optimizer) is not keras.optimizers.Adam or optimizer.amsgrad:
        return False
    extras = (optimizer.weight_decay, optimizer.clipnorm, optimizer.clipvalue,
              optimizer.global_clipnorm, optimizer.loss_scale_factor,
              optimizer.gradient_accumulation_steps)
    if any(x is not None for x in extras) or optimizer.use_ema:
        return False
    return all(getattr(v, "constraint", None) is None
               and not getattr(v, "overwrite_with_gradient", False) for v in variables)


def apply_adam(optimizer, variables, grads) -> bool:
    """Adam's step on `variables` with `grads`, fused (inside a tf.function); False,
    with nothing done, when a gradient is missing or sparse (Keras's own update takes
    those)."""
    if any(g is None or not isinstance(g, tf.Tensor) for g in grads):
        return False
    moments, velocities = adam_slots(optimizer, variables)
    t = tf.cast(optimizer.iterations + 1, tf.float32)
    lr = tf.cast(optimizer.learning_rate, tf.float32)
    b1, b2 = optimizer.beta_1, optimizer.beta_2
    alpha = lr * tf.sqrt(1 - tf.pow(b2, t)) / (1 - tf.pow(b1, t))
    weights, ms, vs = adam_step([_value(v) for v in variables],
                                [_value(m) for m in moments],
                                [_value(v) for v in velocities], list(grads), alpha, b1, b2,
                                optimizer.epsilon)
    for group, new in ((variables, weights), (moments, ms), (velocities, vs)):
        for var, value in zip(group, new, strict=True):
            var.assign(value)
    optimizer.iterations.assign_add(1)
    return True


def fuse(optimizer) -> None:
    """Keras's train_step on one replica with Adam's update fused: the optimizer's
    `apply_gradients` runs `apply_adam`, and Keras's own where that declines (a missing
    or sparse gradient). Only for an optimizer `fusable` says it is exact for."""
    keras_apply = optimizer.apply_gradients

    def apply_gradients(grads_and_vars):
        pairs = list(grads_and_vars)
        if not apply_adam(optimizer, [v for _, v in pairs], [g for g, _ in pairs]):
            return keras_apply(pairs)
        return optimizer.iterations

    optimizer.apply_gradients = apply_gradients


def _value(var):
    """The tf.Variable behind a Keras variable, read."""
    return tf.identity(var.value if isinstance(var, keras.Variable) else var)


__all__ = ["adam_step", "fusable", "apply_adam", "fuse"]
