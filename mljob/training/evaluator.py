"""Evaluation on the eval dataset: inline on the chief, and the evaluator replica.

The evaluator is not part of the training cluster (TensorFlow's strategies hang when it
is); it follows the chief's checkpoints (`<job-dir>/checkpoints/`, or AIP_CHECKPOINT_DIR:
RunConfig.checkpoint_url) through the `checkpoint` state file (published last, so the
checkpoint it names is complete), evaluates each new checkpoint on `eval_dataset_fn()`,
writes `eval/` events under RunConfig.summary_url, and exits 0 once it has evaluated the
final checkpoint (step >= --train-steps). SIGTERM, SIGINT or the launcher's death
(MLJOB_PARENT_PID) end it early, also with status 0: being stopped is how it ends when
the chief fails.

Stopped, it first evaluates the newest published checkpoint once more if it has not yet
done so, then exits. Kubeflow's Training Operator deletes a running evaluator's pod (SIGTERM,
then SIGKILL after the pod's terminationGracePeriodSeconds) the moment the chief succeeds,
which can be before the evaluator has polled the chief's final checkpoint; this last look
is what lets it evaluate that checkpoint anyway (docs/engine-kubeflow.md). The look is one
evaluation, bounded by the stop watchdog (MLJOB_STOP_DEADLINE, mljob.training.signals).
"""
from __future__ import annotations

import weakref

import numpy as np
import tensorflow as tf

from mljob.errors import EXIT_OK, first_line
from mljob.training import export as export_lib
from mljob.training import own_steps
from mljob.training.checkpoints import CheckpointStore
from mljob.training.config import Program, RunConfig
from mljob.training.losses import Objective, unpack
from mljob.training.signals import StopSignal
from mljob.training.summaries import Progress, SummaryWriters

POLL_SECONDS = 1.0

_eval_steps: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def evaluate(model, dataset, objective: Objective | None,
             strategy=None) -> tuple[float, dict[str, float]]:
    """Loss and metrics of `model` over every example of `dataset` (finite, of
    (features, labels[, sample_weight]) batches) as Keras's `evaluate` gives them: each
    metric object updated batch by batch, the loss the batches' mean weighted by their
    sizes. objective None: the model's own test_step (own_steps), in `strategy`."""
    if objective is None:
        return own_steps.evaluate(model, dataset, strategy)
    objective.build(model, dataset.element_spec)
    step = _eval_steps.get(model)
    if step is None:
        @tf.function(autograph=False)  # as Keras's evaluate traces its step
        def eval_step(state, data):
            features, labels, weights = unpack(data)
            outputs = model(features, training=False)
            loss, each = objective.loss(labels, outputs, weights)
            if model.losses:
                loss += tf.add_n([tf.cast(x, tf.float32) for x in model.losses])
            return objective.update(state, labels, outputs, weights, each, loss)
        step = _eval_steps[model] = eval_step
    state = objective.zero_state()
    for data in dataset:
        state = step(state, data)
    return objective.results([np.asarray(v) for v in state])


def run(program: Program, config: RunConfig, stop: StopSignal,
        poll_seconds: float = POLL_SECONDS) -> int:
    """Follow the job's checkpoints until the final one is evaluated (see module doc)."""
    progress = Progress(config.train_steps, enabled=True)
    eval_dataset_fn = program.eval_dataset_fn
    if eval_dataset_fn is None:
        progress.line("evaluator finished: no eval dataset was given, nothing to evaluate")
        return EXIT_OK
    program.description()  # the user's own set-up (the trainer reads its data here)
    model = export_lib.built(program.model_fn)  # named as the chief's, for its checkpoints
    objective = None if own_steps.uses_own_steps(model) else program.objective(model)
    step_var = tf.Variable(0, dtype=tf.int64, trainable=False)
    checkpoint = tf.train.Checkpoint(model={w.path: w.value for w in model.weights},
                                     step=step_var)
    store = CheckpointStore(config.checkpoint_url, keep=config.keep_checkpoints,
                            writer=False)
    writers = SummaryWriters(config.summary_url, enabled=True, jobs=("eval",))
    progress.line(f"evaluator started: following {store.url} until step "
                  f"{config.train_steps}")
    last = None

    def look(step: int) -> bool:
        """Evaluate checkpoint `step`; False when it cannot be read."""
        try:
            checkpoint.read(store.local_prefix(step)).expect_partial()
        except (tf.errors.OpError, OSError, ValueError) as exc:
            # Pruned or replaced under us: the next poll sees a newer one.
            progress.line(f"warning: checkpoint step {step} cannot be read "
                          f"({first_line(exc, 200)}); waiting")
            return False
        loss, metrics = evaluate(model, eval_dataset_fn(), objective)
        progress.eval(step, loss, metrics)
        writers.eval(step, loss=loss, **metrics)
        writers.sync()
        return True

    try:
        while True:
            step = store.latest_published_step()
            if step is not None and step != last and look(step):
                last = step
                if step >= config.train_steps:
                    progress.line(f"evaluator finished: step={step}")
                    return EXIT_OK
            if stop.wait(poll_seconds):
                step = store.latest_published_step()  # the last look (module doc)
                if step is not None and step != last and look(step):
                    last = step
                progress.line(f"evaluator stopping: {stop.reason()}; last evaluated "
                              f"step={'none' if last is None else last}")
                return EXIT_OK
    finally:
        writers.close()
        store.close()


__all__ = ["evaluate", "run"]
