"""mljob's distributed training loop as a library: any Keras 3 model, under every role
TF_CONFIG can give.

Keras 3's `model.fit` does not run under ParameterServerStrategy or
MultiWorkerMirroredStrategy; `fit` here does, in the shape of `model.fit`:

    from mljob import training  # before TensorFlow: GRPC_FAIL_FAST, the CPU kernels

    training.main(model_fn, train_dataset_fn, loss=..., optimizer=..., metrics=[...],
                  eval_dataset_fn=..., serving=training.Serving(inputs={...}),
                  config=training.RunConfig(job_dir=args.job_dir, train_steps=1000))

What each replica does (the cluster is read from TF_CONFIG or Vertex AI's CLUSTER_SPEC):

| role | does |
|---|---|
| single node | trains (MirroredStrategy when it sees several GPUs) |
| chief, with ps | coordinates ParameterServerStrategy: schedules chunks of steps on the workers |
| ps, worker (with ps) | serve (`servers`) until stopped, then exit 0 |
| chief and workers, no ps | train together under MultiWorkerMirroredStrategy |
| evaluator | follows the chief's checkpoints and evaluates each (`evaluator`) |

Only the chief writes: checkpoints (atomic, resumed from), TensorBoard summaries, the
progress lines the launcher reads, and the single-node SavedModel export (published
whole, the instance key passed through). SIGTERM, SIGINT and the launcher's death stop
every replica after a checkpoint (`signals`).

By epochs, the same call is Keras's `fit` on every role and returns Keras's History:

    history = training.fit(model_fn, train_dataset_fn, loss=..., optimizer=..., metrics=...,
                           epochs=10, steps_per_epoch=200, validation_data=val_fn,
                           callbacks=[keras.callbacks.ReduceLROnPlateau(), ...],
                           config=training.RunConfig(job_dir=args.job_dir))

The model from model_fn in the strategy's scope, compiled with the arguments, the data
from train_dataset_fn as the strategy needs it, then the dispatch of a `model.fit`
script (`mljob.fitting`: Keras's own fit on one node, `mirrored.fit` under
MultiWorkerMirrored, `ps_fit.fit` under ps), the user's callbacks first, then the job's:
a line per epoch (`step N/M`, M = epochs * steps_per_epoch) and per validation, the
summaries' tags, the hypertune report, a checkpoint per epoch (the evaluator follows
them), a BackupAndRestore under the checkpoints (a stopped job resumes at its epoch),
SIGTERM stopping at the epoch's end (exit 143), the export on the chief. The ps and the
workers under ps serve and return 0, the evaluator returns 0. That run lives in
`mljob.fitting.library`: `mljob.fitting` stands on this package's loop modules, so
`run` below imports it (inside the function) from above both; no module of
`mljob.fitting` imports this one, and the module graph stays without a circle.

This module and `config`, `outputs`, `signals`, `errors`, `precision` and `kernels`
import no TensorFlow; the loop, the strategies, the evaluator and the export do, when a
run starts. Importing it chooses TensorFlow's CPU kernels (`kernels`).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mljob import cluster as cluster_lib
from mljob import startup
from mljob.coordination import leave_together
from mljob.errors import boundary
from mljob.training import kernels
from mljob.training.config import EPOCH_ARGUMENTS, STEPS_PER_EXECUTION, Epochs, Program, \
    RunConfig, Serving
from mljob.training.errors import PeerUnavailableError, Preempted, TrainingError, UsageError
from mljob.training.signals import StopSignal, exit_now

# A dead worker goes unnoticed unless gRPC fails fast; read when TensorFlow loads gRPC,
# so it is set on import: import mljob.training before tensorflow.
os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
# TensorFlow's CPU kernels, chosen by the hardware (oneDNN's where TensorFlow would keep
# Eigen's on a CPU they beat them on); read once when TensorFlow first needs it, so it too
# is decided on import (mljob.training.kernels).
kernels.choose_once()
# A tuning job's launcher asks which replicas use this library (mljob.prestart).
startup.library_seen()


def fit(model_fn: Callable[[], Any], train_dataset_fn: Callable[[Any], Any], *,
        config: RunConfig, loss: Any = None, optimizer: Any = None,
        metrics: Mapping[str, Any] | Sequence[Any] | None = None,
        loss_weights: Any = None, weighted_metrics: Any = None,
        class_weight: Mapping[int, float] | None = None,
        eval_dataset_fn: Callable[[], Any] | None = None, serving: Serving | None = None,
        describe: str | Callable[[], str] = "",
        info: cluster_lib.ClusterInfo | None = None, stop: StopSignal | None = None,
        epochs: int | None = None, steps_per_epoch: int | None = None,
        validation_data: Any = None, validation_steps: int | None = None,
        validation_freq: int = 1, callbacks: Sequence[Any] | None = None,
        initial_epoch: int = 0) -> Any:
    """Play this replica's role in the run; returns 0 (the step mode, and every replica
    that does not train) or Keras's History (the epoch mode's training replicas),
    raises TrainingError subclasses.

    epochs given: the epoch mode (`mljob.fitting.library`): Keras's `fit` with
    `epochs`, `steps_per_epoch` (required), `validation_data`, `validation_steps`,
    `validation_freq`, `callbacks` and `initial_epoch` as `model.fit` takes them.
    validation_data: a finite dataset or a function returning one; the same as
    eval_dataset_fn (give one of them), in both modes.

    model_fn() -> a Keras 3 model (called inside the strategy's scope, again for the
    evaluator and the export), compiled or not. train_dataset_fn(context) -> an endless
    tf.data.Dataset of (features, labels) or (features, labels, sample_weight) batches
    of `context.batch_size` for one input pipeline; `context` is a
    `tf.distribute.InputContext` (`input_pipeline_id` is a scalar tensor under ps) with
    `batch_size` and `seed` added. Under ps it runs on the workers: build everything
    inside it.

    loss, metrics, loss_weights, weighted_metrics: what `model.compile` takes
    (`losses.Objective`): a Keras loss, its name or a function (labels, outputs) ->
    per-example losses, or a list/dict of them per output; metrics as names (resolved
    as Keras does), functions or Keras metric objects, per output as a list or dict;
    or {name: (labels, outputs) -> per-example values}. Left None they come from the
    model's compile. class_weight: {class index: weight}, as `fit` takes it.
    optimizer: a Keras optimizer's name or a function returning a new one (it must be
    built inside the scope); None: the compiled model's. Its learning rate may be a
    Keras LearningRateSchedule: every role (ps local steps too) takes each step's rate
    from the step count the checkpoints keep. eval_dataset_fn() -> a finite
    dataset of batches like the training ones. serving: the export's signature; None:
    no export. describe: extra `key=value` text for the "training started" line (its
    first pair, the model's name, comes before `replicas=`, the rest before
    `job_dir=`). info and stop default to the environment's cluster and a new
    StopSignal.
    """
    if validation_data is not None and eval_dataset_fn is not None:
        raise UsageError("validation_data and eval_dataset_fn are the same thing: give "
                         "one of them")
    if validation_data is not None:
        if not callable(validation_data) and not _is_dataset(validation_data):
            raise UsageError(f"validation_data is a {type(validation_data).__name__}: give "
                             "a finite tf.data.Dataset of (features, labels) batches, or a "
                             "function returning one")
        eval_dataset_fn = validation_data if callable(validation_data) \
            else (lambda: validation_data)
    program = Program(model_fn=model_fn, train_dataset_fn=train_dataset_fn, loss=loss,
                      optimizer=optimizer, metrics=metrics, eval_dataset_fn=eval_dataset_fn,
                      serving=serving, describe=describe, loss_weights=loss_weights,
                      weighted_metrics=weighted_metrics, class_weight=class_weight)
    given = {"steps_per_epoch": steps_per_epoch, "validation_steps": validation_steps,
             "validation_freq": validation_freq, "callbacks": callbacks or None,
             "initial_epoch": initial_epoch}
    if epochs is None:
        named = [k for k, v in given.items() if v != EPOCH_ARGUMENTS[k]]
        if named:
            raise UsageError(f"{named[0]} belongs to the epoch mode: give epochs=N too "
                             "(or train by steps with RunConfig.train_steps alone)")
        return run(program, config, info=info, stop=stop)
    return run(program, config, info=info, stop=stop, epochs=Epochs(
        epochs, steps_per_epoch, validation_steps, validation_freq,
        tuple(callbacks or ()), initial_epoch))


def run(program: Program, config: RunConfig, *, info: cluster_lib.ClusterInfo | None = None,
        stop: StopSignal | None = None, epochs: Epochs | None = None) -> Any:
    """`fit` with the user's side as one `Program` (and the epoch mode's `Epochs`)."""
    if info is None:
        info = cluster_lib.from_environment(os.environ)
    if epochs is not None:
        epochs.check(config, validation=program.eval_dataset_fn is not None)
    config = config.resolved(os.environ)
    # Known before TensorFlow loads, but for a single node (mirrored needs the GPU count).
    kind = None if info.is_single_node else info.strategy_kind(config.strategy, num_gpus=0)
    require_tensorflow()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    stop = stop or StopSignal()
    if info.is_evaluator:
        stop.install()
        from mljob.training import evaluator
        if epochs is not None:  # the epoch mode checkpoints every epoch's end
            config = dataclasses.replace(config, train_steps=epochs.train_steps)
        return evaluator.run(program, config, stop)
    if kind == "ps" and info.task_type in (cluster_lib.PS, cluster_lib.WORKER):
        from mljob.training import servers
        return servers.serve(info, stop)
    import tensorflow as tf
    if kind is None:
        kind = info.strategy_kind(config.strategy,
                                  num_gpus=len(tf.config.list_physical_devices("GPU")))
    # Until the strategy starts (the loop takes the signals over then), SIGTERM ends a
    # replica at once: there is nothing to save yet.
    if epochs is not None:
        # Keras's fit and the fitting wing's dispatch, above this package's loop modules
        # (mljob.fitting imports them, never this one): see the module doc.
        from mljob.fitting import library
        done = library.run(info, program, config, kind, stop, epochs)
    else:
        from mljob.training import steps
        done = steps.run(info, program, config, kind, stop)
    if kind == "multiworker":  # no task ends while another still runs (coordination)
        leave_together("mljob-training-end")
    return done


def serve_if_server(info: cluster_lib.ClusterInfo | None = None,
                    config: RunConfig | None = None) -> int | None:
    """For a parameter server, or a worker under ParameterServerStrategy: serve now, and
    return its exit status (it never returns: the process ends when stopped). None for
    every other replica. A task module that calls this before it imports its model and
    data (as the bundled trainer does) starts its servers without Keras and without
    loading data (`mljob.startup`); `fit` serves such replicas either way."""
    if info is None:
        info = cluster_lib.from_environment(os.environ)
    config = config or RunConfig()
    if info.is_single_node or info.is_evaluator:
        return None
    kind = info.strategy_kind(config.strategy, num_gpus=0)
    if kind != "ps" or info.task_type not in (cluster_lib.PS, cluster_lib.WORKER):
        return None
    require_tensorflow()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    from mljob.training import servers
    return servers.serve(info, StopSignal())


def main(model_fn: Callable[[], Any], train_dataset_fn: Callable[[Any], Any], **kwargs) -> None:
    """`fit`, then end the process with its exit status: a one-line `error: ...` for
    typed errors (status 2 for usage, 143 stopped after saving, 200 a peer is gone), a
    traceback only for a bug (`mljob.errors.boundary`). What a user's `task.py` calls
    last."""
    exit_now(boundary(lambda: _status(fit(model_fn, train_dataset_fn, **kwargs)),
                      program="training"))


def _is_dataset(value: Any) -> bool:
    """A tf.data.Dataset (TensorFlow is loaded when one exists)."""
    import sys
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(value, tf.data.Dataset)


def _status(result: Any) -> int:
    """An exit status, or 0 for the epoch mode's History."""
    return result if isinstance(result, int) else 0


def require_tensorflow() -> None:
    import importlib.util
    if importlib.util.find_spec("tensorflow") is None:  # an extra, not a requirement
        raise TrainingError("TensorFlow is not installed for this Python; install mljob "
                            "with its cpu or gpu extra (pip install 'mljob[cpu]'), or run "
                            "in an image that has TensorFlow")


__all__ = ["fit", "run", "main", "serve_if_server", "RunConfig", "Serving", "Program",
           "Epochs", "StopSignal",
           "STEPS_PER_EXECUTION", "require_tensorflow", "TrainingError", "UsageError",
           "PeerUnavailableError", "Preempted"]
