"""Under parameter servers, what the workers share is changed by additions on the ps,
never by a worker's read-then-write.

Asynchronous workers each read a variable, compute, and write: for the weights that is
the point (each adds its update), but Keras writes the optimizer's step count
(`iterations.assign(iterations + 1)`) and the layers' state (BatchNormalization's moving
statistics, a layer's own counters: `assign(new value)`) as overwrites, so two workers
that overlap lose one's change: the count lags (and every learning-rate schedule with
it), the moving statistics keep about half their updates. Here the count is added
atomically on the ps (`atomic_iterations`), and the layers' writes in a step are held
(`keeping_state`, a keras.StatelessScope) and added on the ps as the step's change
(`add_change`).
"""
from __future__ import annotations

import keras
import tensorflow as tf


def atomic_iterations(optimizer) -> None:
    """Under ps, make the optimizer's step count an atomic addition on the ps: Keras
    adds to it by a read and a write (`assign(self + 1)`), which two workers overlap,
    losing steps (and every learning-rate schedule lags)."""
    counter = optimizer.iterations
    inner = tf_variable(counter)

    def assign_add(value):
        return inner.assign_add(tf.cast(value, inner.dtype))
    object.__setattr__(counter, "assign_add", assign_add)


def add_change(var, old, new) -> None:
    """Add new - old to a (ps) variable where it can be added; else set it (a random
    seed's state). The change is computed here, on the worker: only it crosses the wire.
    A value the step did not write (`new is old`, as keras.StatelessScope gives it back:
    a frozen layer's statistics) is left alone."""
    if new is old:
        return
    target = tf_variable(var)
    if target.dtype.is_floating or target.dtype in (tf.int32, tf.int64):
        change = tf.cast(new, target.dtype) - tf.cast(old, target.dtype)
        target.assign_add(change)
    else:
        target.assign(new)


class keeping_state:
    """Under ps, a forward pass whose writes to the layers' state (`variables`) are held
    (keras.StatelessScope) and then added to the ps as changes (`add_changes`); with no
    variables, nothing is held."""

    def __init__(self, variables):
        self.variables = list(variables)
        self.losses: list = []
        self._scope = None

    def __enter__(self):
        if self.variables:
            self.before = [tf.identity(tf_variable(v)) for v in self.variables]
            self._scope = keras.StatelessScope(
                state_mapping=list(zip(self.variables, self.before, strict=True)),
                collect_losses=True)
            self._scope.__enter__()
        return self

    def __exit__(self, *exc):
        if self._scope is not None:
            self.after = [self._scope.get_current_value(v) for v in self.variables]
            self.losses = list(self._scope.losses)  # add_loss's; the regularizers' follow
            self._scope.__exit__(*exc)
        return False

    def add_changes(self) -> None:
        if self._scope is None:
            return
        for var, old, new in zip(self.variables, self.before, self.after, strict=True):
            if new is not None:
                add_change(var, old, new)


def tf_variable(var):
    """The tf.Variable behind a Keras variable (a shard already is one)."""
    return var.value if isinstance(var, keras.Variable) else var


__all__ = ["atomic_iterations", "add_change", "keeping_state", "tf_variable"]
