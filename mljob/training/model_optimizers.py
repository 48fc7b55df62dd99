"""The optimizers a model uses, each by the attribute that holds it.

A model that brings its own `train_step` may hold several optimizers (keras.io's GAN:
`d_optimizer` and `g_optimizer`, both named `adam`) and a compiled one its step never
applies (`super().compile()` with no arguments makes an RMSprop). Its optimizers often
build themselves lazily, on their first `apply_gradients` inside the step, so before
training they hold only a step count and a learning rate.

`build_in_step` traces (never runs) the model's `train_step` on the dataset's element
spec, as Keras's `fit` traces its train function: every optimizer the step applies
makes its variables then, so the checkpoint made after it holds all of them (a resumed
run restores the moments instead of restarting them at zero), and the optimizers the
traced step reads are the ones it uses: their learning rates are what the progress
lines show.
"""
from __future__ import annotations

import keras
import tensorflow as tf

from mljob.training.shared_state import tf_variable


def named(model) -> list[tuple[str, keras.optimizers.Optimizer]]:
    """(attribute, optimizer) of every optimizer the model holds: the compiled one
    (`optimizer`) first, then the others by the attribute they are set on."""
    found: list[tuple[str, keras.optimizers.Optimizer]] = []
    compiled = getattr(model, "optimizer", None)
    if isinstance(compiled, keras.optimizers.Optimizer):
        found.append(("optimizer", compiled))
    for name, value in list(vars(model).items()):
        if isinstance(value, keras.optimizers.Optimizer) and all(
                value is not o for _, o in found):
            found.append((name.lstrip("_"), value))
    return found


def attribute_of(model, optimizer) -> str:
    """The attribute that holds `optimizer` on the model (`g_optimizer`), else its name."""
    return next((name for name, o in named(model) if o is optimizer), optimizer.name)


def build_in_step(model, element_spec) -> list[tuple[str, keras.optimizers.Optimizer]]:
    """Trace the model's own `train_step` on one batch's spec (building every optimizer
    it applies); (attribute, optimizer) of those the traced step steps (it reads their
    step counts), in `named` order."""
    traced = tf.function(model.train_step, autograph=False).get_concrete_function(
        element_spec)
    read = {id(v) for v in traced.graph.variables}
    return [(name, o) for name, o in named(model)
            if id(tf_variable(o.iterations)) in read]


def learning_rate(optimizer) -> float:
    try:
        return float(optimizer.learning_rate.numpy()
                     if hasattr(optimizer.learning_rate, "numpy")
                     else optimizer.learning_rate)
    except (TypeError, ValueError):
        return float("nan")


__all__ = ["named", "attribute_of", "build_in_step", "learning_rate"]
