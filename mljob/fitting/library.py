"""`mljob.training.fit(..., epochs=N)`: the library call's epoch mode, which is Keras's
`fit` on every role.

The replica that trains (a single node, the chief and the workers under
MultiWorkerMirroredStrategy, the chief under ParameterServerStrategy) builds the model
from `model_fn` in the strategy's scope, compiles it with the call's loss, optimizer and
metrics when they are given or it is not compiled (`own_steps.compile_for_keras`, as
the step mode's one node does), takes its data from `train_dataset_fn` as the strategy
needs it (one node: one pipeline of the whole batch; MultiWorkerMirrored: one per
replica, `distribute_datasets_from_function`; parameter servers: one per worker, run
there), then runs `model.fit` through the same dispatch as the patched `fit`
(`mljob.fitting.dispatch_fit`: Keras's own `fit` on one node, `mirrored.fit` under
MultiWorkerMirrored, `ps_fit.fit` under ps) with the user's callbacks and, after
them, the job's (`job_callbacks`, and a `BackupAndRestore` into
`<checkpoints>/backup` unless the user gave one: a stopped job run again resumes at
its epoch; a remote one is written locally and uploaded each epoch). It returns
Keras's `History`; the chief then exports (`serving=`). Parameter servers and the
workers under them serve and return 0, the evaluator follows the per-epoch
checkpoints and returns 0 (`mljob.training.run`).

The front door (`mljob.training.fit`) hands the run over here: this package stands
above `mljob.training`'s loop modules (it imports them, and never `mljob.training`
itself), so the arrow from the front door down to this module closes no circle.
"""
from __future__ import annotations

import shutil
import tempfile
import time

import keras
import tensorflow as tf

from mljob import fitting, storage
from mljob.cluster import ClusterInfo
from mljob.fitting.job_callbacks import BackupUpload, EpochCheckpoints, JobReport, \
    StopOnSignal
from mljob.fitting.mirrored_callbacks import AnyWorker
from mljob.training import export as export_lib
from mljob.training import own_steps
from mljob.training.checkpoints import CheckpointStore
from mljob.training.config import Epochs, Program, RunConfig
from mljob.training.errors import Preempted, UsageError
from mljob.training.loop import InputContext
from mljob.training.losses import compiled_optimizer, one_replica
from mljob.training.optimizers import make_optimizer
from mljob.training.signals import StopSignal
from mljob.training.steps import export_model, replicas_of, start_strategy
from mljob.training.strategies import peers_answering
from mljob.training.summaries import Progress, SummaryWriters

BACKUP = "backup"  # BackupAndRestore's folder under the checkpoints


def run(info: ClusterInfo, program: Program, config: RunConfig, kind: str,
        stop: StopSignal, epochs: Epochs) -> keras.callbacks.History:
    """Train by epochs on this replica (module doc); Keras's History."""
    strategy, _ = start_strategy(info, config, kind, stop)
    replicas = replicas_of(info, kind, strategy, config)
    chief = info.is_chief
    model = build(program, strategy, kind)
    if chief and program.serving is not None and program.serving.model_fn is not None:
        export_lib.check_serving_model(program.serving.model_fn, {
            w.path: tuple(w.shape) for w in model.weights})
    seed = config.seed or 0
    x, spec = data(program, config, strategy, kind, seed)
    if spec is not None and not own_steps.uses_own_steps(model):  # ps_fit checks its own
        # what does not fit the data, in one line, before Keras's step fails tracing
        program.objective(model).build(model, one_replica(spec))
    validation = program.eval_dataset_fn() if program.eval_dataset_fn else None
    progress = Progress(epochs.train_steps, enabled=chief)
    writers = SummaryWriters(config.summary_url, enabled=chief)
    store = CheckpointStore(config.checkpoint_url, keep=config.keep_checkpoints,
                            writer=chief)
    head, _, rest = program.description().partition(" ")
    started = (f"training started: strategy={kind} epoch={{epoch}} epochs={epochs.epochs} "
               f"steps_per_epoch={epochs.steps_per_epoch} step={{step}} train_steps="
               f"{epochs.train_steps} " + (f"{head} " if head else "")
               + f"replicas={replicas} batch_size={config.batch_size} "
               + (f"{rest} " if rest else "") + f"job_dir={config.job_dir}")
    report = JobReport(progress, writers, started=started,
                       steps_per_epoch=epochs.steps_per_epoch or 0,
                       batch_size=config.batch_size,
                       own_steps=own_steps.uses_own_steps(model))
    user = list(epochs.callbacks)
    scratch = tempfile.mkdtemp(prefix="mljob-backup-")
    backup = [] if any(isinstance(c, keras.callbacks.BackupAndRestore) for c in user) \
        else backups(storage.join(config.checkpoint_url, BACKUP), scratch, chief)
    stopper = StopOnSignal(stop, AnyWorker(strategy) if kind == "multiworker" else None)
    arguments = dict(x=x, epochs=epochs.epochs, steps_per_epoch=epochs.steps_per_epoch,
                     validation_data=validation, validation_steps=epochs.validation_steps,
                     validation_freq=epochs.validation_freq,
                     callbacks=[*user, *backup, report,
                                EpochCheckpoints(store, epochs.steps_per_epoch or 0),
                                stopper],
                     initial_epoch=epochs.initial_epoch, verbose=0,
                     shuffle=False,  # a dataset's own order (Keras ignores it, warning)
                     class_weight=None if kind == "multiworker" else program.class_weight)
    if kind == "ps":
        arguments["batch_size"] = config.batch_size  # each worker's pipeline's batch
    began = time.monotonic()
    try:
        with peers_answering(info, kind, "run the job again to resume from the epoch it "
                             "reached"):
            history = fitting.dispatch_fit(model, **arguments)
    finally:
        writers.close()
        store.close()
        shutil.rmtree(scratch, ignore_errors=True)
    done = report.epochs_done
    if stopper.stopped_after is not None and done < epochs.epochs:
        why = stop.reason() if stop.requested() else "another replica was stopped"
        raise Preempted(f"stopped after epoch {done} ({why}); backup saved, run again to "
                        "resume")
    step = done * (epochs.steps_per_epoch or 0)
    if not history.epoch and done >= epochs.epochs:  # its backup says every epoch ran
        progress.line(f"training finished: step={step} already_done=true")
        if chief and program.serving is not None and storage.exists(
                storage.join(config.export_url, "saved_model.pb")):
            progress.line(f"model already exported at {config.export_url}")
            return history
    else:
        train = dict(report.last)
        loss = train.pop("loss", None)
        progress.line(f"training finished: step={step} epochs={done}"
                      + ("" if loss is None else f" loss={loss:.4f}")
                      + "".join(f" {k}={v:.4f}" for k, v in train.items())
                      + f" seconds={time.monotonic() - began:.1f}")
    if chief and program.serving is not None:
        progress.line(f"exported model to {export_model(model, program, config)}")
    return history


def backups(url: str, scratch: str, chief: bool) -> list:
    """The job's BackupAndRestore into `url`, kept when training ends (a finished job
    run again trains no more); for a remote URL through a local folder (BackupUpload)."""
    if storage.is_local(url):
        return [keras.callbacks.BackupAndRestore(storage.local_path(url),
                                                 delete_checkpoint=False)]
    upload = BackupUpload(scratch, url, enabled=chief)
    upload.download()
    return [keras.callbacks.BackupAndRestore(scratch, delete_checkpoint=False), upload]


def build(program: Program, strategy, kind: str) -> keras.Model:
    """model_fn's model in the strategy's scope, compiled for Keras's fit (module doc)."""
    with strategy.scope():
        model = export_lib.built(program.model_fn)  # named as the export's
        if not isinstance(model, keras.Model):
            raise UsageError(f"model_fn gave {type(model).__name__}, not a Keras model; "
                             "return a keras.Model")
        if own_steps.uses_own_steps(model):
            own_steps.check(model, program, parameter_servers=kind == "ps",
                            replicas=strategy.num_replicas_in_sync)
            return model
        optimizer = make_optimizer(program.optimizer) if program.optimizer is not None \
            else compiled_optimizer(model)
        own_steps.compile_for_keras(model, program, optimizer, program.objective(model))
    return model


def data(program: Program, config: RunConfig, strategy, kind: str, seed: int):
    """`train_dataset_fn`'s data as the strategy's fit takes it (module doc), and the
    element spec it gave (None under ps, where it runs on the workers)."""
    if kind == "ps":  # run on each worker by ps_fit, with mljob's InputContext
        return program.train_dataset_fn, None
    given: list = []

    def pipeline(context: InputContext):
        dataset = program.train_dataset_fn(context)
        if not isinstance(dataset, tf.data.Dataset):
            raise UsageError(f"train_dataset_fn gave {type(dataset).__name__}, not a "
                             "tf.data.Dataset")
        given.append(dataset.element_spec)
        return dataset

    if kind == "multiworker":  # class_weight mapped per replica (Keras maps a Dataset)
        x = strategy.distribute_datasets_from_function(
            lambda context: own_steps.with_class_weight(pipeline(
                InputContext.from_tf(context, config.batch_size, seed)),
                program.class_weight))
    else:
        x = pipeline(InputContext(global_batch_size=config.batch_size, seed=seed))
    return x, given[0]


__all__ = ["run", "build", "data", "backups", "BACKUP"]
