"""The run's optimizer and the step options it is checked for (no TensorFlow graph here):

- `make_optimizer`: a new optimizer from a name or a function, inside the scope;
- `steps_per_execution`: the run's steps per function (the config's, or compile's);
- `check_synchronous_options`: what synchronous replicas or parameter servers cannot
  run (EMA, gradient accumulation), refused before training;
- `optimizer_text`: an optimizer as the refusals name it.
"""
from __future__ import annotations

import keras

from mljob.training.config import STEPS_PER_EXECUTION, RunConfig
from mljob.training.errors import UsageError


def make_optimizer(spec) -> keras.optimizers.Optimizer:
    """A new optimizer from a name or a function (inside the strategy's scope: a Keras 3
    optimizer makes its iteration counter when it is created)."""
    if isinstance(spec, keras.optimizers.Optimizer):
        raise UsageError("give the optimizer as a function that returns a new one (e.g. "
                         "optimizer=lambda: keras.optimizers.Adam(1e-3)), or its name: it "
                         "must be created inside the strategy's scope")
    optimizer = keras.optimizers.get(spec) if isinstance(spec, str) else spec()
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise UsageError(f"optimizer gave {type(optimizer).__name__}, not a Keras "
                         "optimizer; return e.g. keras.optimizers.Adam(1e-3)")
    return optimizer


def steps_per_execution(model, config: RunConfig) -> int:
    """The run's steps per function: the config's, unless it is the default and the
    model was compiled with steps_per_execution > 1 (as Keras's fit would take it; the
    started line then says `(compile's)`). Under ps local steps it is also how many
    steps a worker runs between two merges."""
    compiled = int(getattr(model, "steps_per_execution", 1) or 1)
    if config.steps_per_execution == STEPS_PER_EXECUTION and compiled > 1:
        return compiled
    return config.steps_per_execution


def check_synchronous_options(optimizer, strategy, coordinator) -> None:
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
                f"{optimizer_text(optimizer)}: {option} cannot run under {where} "
                "(Keras's fit cannot run it under a distribution strategy either); train "
                f"on one node, or leave {option} out")


def optimizer_text(optimizer) -> str:
    """An optimizer as the refusal names it: Adam(clipnorm=1.0), SGD..."""
    options = [f"{name}={getattr(optimizer, name)}" for name in (
        "clipnorm", "clipvalue", "global_clipnorm", "weight_decay", "loss_scale_factor",
        "gradient_accumulation_steps") if getattr(optimizer, name, None) is not None]
    if getattr(optimizer, "use_ema", False):
        options.append("use_ema=True")
    if getattr(optimizer, "amsgrad", False):
        options.append("amsgrad=True")
    return f"{type(optimizer).__name__}({', '.join(options)})"


__all__ = ["make_optimizer", "steps_per_execution", "check_synchronous_options",
           "optimizer_text"]
