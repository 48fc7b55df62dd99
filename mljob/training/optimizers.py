"""The run's optimizer and its steps per function (no TensorFlow graph here):

- `make_optimizer`: a new optimizer from a name or a function, inside the scope;
- `steps_per_execution`: the run's steps per function (the config's, or compile's).

What synchronous replicas or parameter servers cannot run, and how a refusal names an
optimizer, is `mljob.training.model_optimizers`.
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


__all__ = ["make_optimizer", "steps_per_execution"]
