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
lines show; and a refusal names an optimizer by its attribute (`optimizer_text`).
"""
from __future__ import annotations

import keras
import tensorflow as tf

from mljob.training.errors import UsageError
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


def optimizer_text(optimizer, model=None) -> str:
    """An optimizer as a refusal names it: `Adam(clipnorm=1.0)`, and with the model the
    attribute that holds it first (`g_optimizer=Adam(use_ema=True)`): a GAN's two are
    both named `adam`."""
    options = [f"{name}={getattr(optimizer, name)}" for name in (
        "clipnorm", "clipvalue", "global_clipnorm", "weight_decay", "loss_scale_factor",
        "gradient_accumulation_steps") if getattr(optimizer, name, None) is not None]
    if getattr(optimizer, "use_ema", False):
        options.append("use_ema=True")
    if getattr(optimizer, "amsgrad", False):
        options.append("amsgrad=True")
    text = f"{type(optimizer).__name__}({', '.join(options)})"
    return text if model is None else f"{attribute_of(model, optimizer)}={text}"


def check_synchronous_options(optimizer, strategy, coordinator, model=None) -> None:
    """EMA and gradient accumulation update under a tf.cond that calls merge_call, which
    a step run by a distribution strategy cannot do (Keras's own fit fails on them under
    a MirroredStrategy, and a ps step fails the same way): refused before the first step,
    not a traceback at it."""
    replicas = strategy.num_replicas_in_sync
    if coordinator is None and replicas < 2:
        return
    where = "parameter servers" if coordinator is not None else \
        f"{replicas} synchronous replicas"
    for option in ("use_ema", "gradient_accumulation_steps"):
        if getattr(optimizer, option, None):
            raise UsageError(
                f"{optimizer_text(optimizer, model)}: {option} cannot run under {where} "
                "(Keras's fit cannot run it under a distribution strategy either); train "
                f"on one node, or leave {option} out")


def learning_rate(optimizer) -> float:
    try:
        return float(optimizer.learning_rate.numpy()
                     if hasattr(optimizer.learning_rate, "numpy")
                     else optimizer.learning_rate)
    except (TypeError, ValueError):
        return float("nan")


__all__ = ["named", "attribute_of", "build_in_step", "optimizer_text",
           "check_synchronous_options", "learning_rate"]
