"""Keras's `train_step` / `test_step` (the model's own, or keras.Model's), run as Keras's
`fit` runs them: every step of one node and of synchronous replicas (`compile_for_keras`
compiles a model with the run's loss, metrics and optimizer first); parameter servers
run the library's own step (`mljob.training.loop`).

keras.io's "Customizing what happens in fit()" overrides `train_step` (GANs, VAEs,
contrastive and auxiliary-update models), `test_step`, `compute_loss` or
`compute_metrics`. Such a model's steps are the model's, not this library's: each step
is `strategy.run(model.train_step, (batch,))`, its logs reduced across replicas as
Keras's `fit` reduces them (`reduce_per_replica`, "auto"), its metric trackers reset at
each log line (the line shows the steps since the previous one) and at each evaluation.

- one node: run as `fit` runs them;
- MultiWorkerMirrored (and mirrored GPUs): run as `fit` runs them under a
  MirroredStrategy: each replica runs the step on its share of the batch, Keras's losses
  scale by the replica count, the optimizer all-reduces the gradients;
- parameter servers: refused before training, since the step's metric and state updates
  are read-then-write on variables the workers share, which asynchronous workers would
  overwrite.

What the step needs must exist before it is distributed: the model compiled in
`model_fn` (its optimizer, loss and metrics are the step's, so `fit`'s own `loss=`,
`optimizer=` and `metrics=` are refused rather than ignored), and, with several
replicas, every optimizer the step applies built (`optimizer.build(variables)` in
`compile`): tf.distribute cannot create an optimizer's state inside a replica's step.
On one node an optimizer may build itself in its first `apply_gradients`, as in Keras:
the model's `train_step` is traced before training (`model_optimizers.build_in_step`),
which builds it, so the checkpoints hold every optimizer the step applies.
"""
from __future__ import annotations

import weakref

import keras
import tensorflow as tf

from mljob.training.errors import UsageError
from mljob.training.keras_private import pythonify_logs, symbolic_build, tree
from mljob.training.losses import as_floats, compiled_config
from mljob.training.summaries import NO_LOSS

STEPS = ("train_step", "test_step", "compute_loss", "compute_metrics")
_eval_steps: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def overridden(model, name: str) -> bool:
    """Whether the model's class defines its own `name` (not Keras's)."""
    own = getattr(type(model), name, None)
    return own is not None and own is not getattr(keras.Model, name, None)


def uses_own_steps(model) -> bool:
    """Whether the model brings its own step (see the module doc)."""
    return any(overridden(model, name) for name in STEPS)


def optimizers(model) -> list:
    """The model's optimizers: the compiled one and any others it holds (a GAN's)."""
    found = [model.optimizer] if isinstance(getattr(model, "optimizer", None),
                                            keras.optimizers.Optimizer) else []
    for value in list(vars(model).values()):
        if isinstance(value, keras.optimizers.Optimizer) and all(
                value is not o for o in found):
            found.append(value)
    return found


def check(model, program, *, parameter_servers: bool, replicas: int) -> None:
    """UsageError, before any step, for what a model's own step cannot do here."""
    steps = ", ".join(n for n in STEPS if overridden(model, n))
    name = type(model).__name__
    if parameter_servers:
        raise UsageError(
            f"model {name} brings its own {steps}: parameter servers cannot run it as "
            "Keras does (its metric and state updates would be overwritten by "
            "asynchronous workers); train it under MultiWorkerMirroredStrategy (chief "
            "and workers, no ps replicas) or on one node")
    given = [arg for arg in ("loss", "optimizer", "metrics", "loss_weights",
                             "weighted_metrics", "class_weight")
             if getattr(program, arg) is not None]
    if given:
        raise UsageError(
            f"model {name} brings its own {steps}, which uses what compile gave it, not "
            f"training's {'/'.join(given)}=: compile the model in model_fn with them and "
            "leave them out of training.fit/main")
    if not getattr(model, "compiled", False):
        raise UsageError(f"model {name} brings its own {steps}: compile it in model_fn "
                         "(at least model.compile(optimizer=...)) as for Keras's fit")
    if program.eval_dataset_fn is not None and not overridden(model, "test_step") and \
            type(model).call is keras.Model.call:
        raise UsageError(
            f"model {name} has no call() and no test_step of its own, so it cannot be "
            "evaluated (Keras's evaluate fails on it too): override test_step, or give "
            "no eval_dataset_fn")
    if replicas > 1:
        from mljob.training.model_optimizers import attribute_of
        unbuilt = [f"{attribute_of(model, o)} ({o.name})" for o in optimizers(model)
                   if not o.built and o is not model.optimizer]
        if unbuilt:
            raise UsageError(
                f"model {name}'s optimizer {unbuilt[0]} is not built, and tf.distribute "
                f"cannot create its state inside a step of {replicas} replicas: build "
                "it in compile (optimizer.build(the variables it updates))")


def compile_for_keras(model, program, optimizer, objective) -> None:
    """Compile `model` for Keras's own train_step: the run's loss and metrics (what
    training.fit was given, else what compile was, resolved and checked by
    `losses.Objective`) and `optimizer`. A compiled model the run changes nothing of is
    kept as it is. `objective`: program.objective(model)."""
    given = [a for a in ("loss", "metrics", "loss_weights", "weighted_metrics")
             if getattr(program, a) is not None]
    if getattr(model, "compiled", False) and not given and model.optimizer is optimizer:
        return
    config = compiled_config(model)
    model.compile(optimizer=optimizer, loss=objective.user_loss,
                  metrics=objective.user_metrics, loss_weights=objective.loss_weights,
                  weighted_metrics=objective.user_weighted,
                  steps_per_execution=config.get("steps_per_execution", 1))


def build_for_keras(model, strategy, element_spec) -> None:
    """The compiled model's metrics, loss and optimizer built from the data's shapes, as
    Keras's fit builds them before its first step (`_symbolic_build`)."""
    with strategy.scope():
        symbolic_build(model, element_spec)


def with_class_weight(dataset, class_weight):
    """The dataset with `fit`'s class_weight as sample weights, mapped as Keras's fit maps
    a dataset (None: the dataset as it is)."""
    if not class_weight:
        return dataset
    from mljob.training.keras_private import make_class_weight_map_fn
    return dataset.map(make_class_weight_map_fn(dict(class_weight)))


def reduce_logs(logs, strategy):
    """A step's logs, one value per name, as Keras's fit reduces them over replicas: their
    mean (`reduce_per_replica`'s "auto" off TPUs), element by element."""
    from mljob.training.keras_private import tree
    return tree.map_structure(
        lambda v: strategy.reduce(tf.distribute.ReduceOp.MEAN, v, axis=None), logs)


def results(model, logs, every_replica: bool = True) -> tuple[float, dict[str, float]]:
    """(loss, metrics) of fetched logs, as Python floats (nested dicts flattened as
    Keras's fit flattens them, `pythonify_logs`); the model's trackers reset. As Keras's
    fit ends an epoch: when the logs are the model's metrics, their values read from
    the metrics' state over every replica (the logs of a step are one replica's): a
    collective under MultiWorkerMirrored, which every replica takes part in; the chief's
    evaluation alone passes every_replica=False and keeps its own logs."""
    if every_replica:
        metric_logs = model.get_metrics_result()
        if isinstance(logs, dict) and set(logs) == set(metric_logs):
            logs = metric_logs
    values = as_floats(pythonify_logs(logs))
    reset(model)
    return values.pop("loss", NO_LOSS), values


def reset(model) -> None:
    for metric in model.metrics:
        metric.reset_state()


def evaluate(model, dataset, strategy=None) -> tuple[float, dict[str, float]]:
    """The model's own `test_step` over every batch of `dataset`, as Keras's `evaluate`:
    trackers reset first, the last step's logs reported."""
    strategy = strategy or tf.distribute.get_strategy()
    step = _eval_steps.get(model)
    if step is None:
        def one(data):
            logs = strategy.run(model.test_step, args=(data,))
            # Only this replica evaluates: its own values, never a collective.
            return tree.map_structure(
                lambda v: strategy.experimental_local_results(v)[0], logs)
        step = _eval_steps[model] = tf.function(one, autograph=False)
    reset(model)
    logs: dict = {}
    for data in dataset:
        logs = step(data)
    return results(model, logs, every_replica=False)


__all__ = ["STEPS", "overridden", "uses_own_steps", "optimizers", "check",
           "compile_for_keras", "build_for_keras", "with_class_weight", "reduce_logs",
           "results", "reset", "evaluate"]
