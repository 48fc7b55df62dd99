"""Adam's update fused by XLA, for local steps under ps.

Keras applies Adam op by op: each weight tensor is read and written about twelve times
a step (the two moments, their bias corrections, the step). XLA fuses each tensor's
update into one pass over it. Under ps local steps it cut the CNN worker's step from
45-58 CPU-ms to 34-37 in mixed bfloat16 (bench/local_update.py). One node and
synchronous replicas run Keras's own train_step instead (`own_steps`): side by side on
the default CNN job the fused update saved about 1% of a step's CPU time there
(bench/README.md), not worth a second update path.

`fusable` says when the fused update is exactly Keras's: plain Adam with none of the
optimizer's extras (weight decay, clipping, EMA, gradient accumulation, loss scaling)
and no variable constraints; local steps run only then.
"""
from __future__ import annotations

import keras
import tensorflow as tf


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
    """Whether `adam_step` computes exactly what `optimizer.apply_gradients` would."""
    if type(optimizer) is not keras.optimizers.Adam or optimizer.amsgrad:
        return False
    extras = (optimizer.weight_decay, optimizer.clipnorm, optimizer.clipvalue,
              optimizer.global_clipnorm, optimizer.loss_scale_factor,
              optimizer.gradient_accumulation_steps)
    if any(x is not None for x in extras) or optimizer.use_ema:
        return False
    return all(getattr(v, "constraint", None) is None
               and not getattr(v, "overwrite_with_gradient", False) for v in variables)


__all__ = ["adam_step", "fusable"]
