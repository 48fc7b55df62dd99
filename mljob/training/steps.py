"""The run of one replica that trains: wait for the cluster, make the strategy and the
`Replica` (`mljob.training.loop`), restore the latest checkpoint, then the step loop with
its side effects at step boundaries (the log line and train summaries, checkpoints,
evaluation, the hypertune report) and the export.

Under ps the first step's line waits until the next chunk is scheduled: that chunk goes to
another worker, whose first run (setting the function up) then overlaps the first
worker's instead of following it.
"""
from __future__ import annotations

import time

import tensorflow as tf

from mljob import hypertune, startup, storage
from mljob.cluster import ClusterInfo
from mljob.errors import EXIT_OK
from mljob.training.checkpoints import CheckpointStore, finalize
from mljob.training.config import Program, RunConfig
from mljob.training.errors import Preempted, UsageError
from mljob.training.evaluator import evaluate
from mljob.training.loop import Replica
from mljob.training.signals import StopSignal
from mljob.training.strategies import check_collectives_can_start, make_strategy, \
    peers_answering, wait_for_leader, wait_for_peers, weights_numpy
from mljob.training.summaries import NO_LOSS, Progress, SummaryWriters


def run(info: ClusterInfo, program: Program, config: RunConfig, kind: str,
        stop: StopSignal) -> int:
    """Train to config.train_steps (resuming from the latest checkpoint), then export.
    Returns the exit status; raises TrainingError subclasses for the rest."""
    chief = info.is_chief
    progress = Progress(config.train_steps, enabled=chief)
    strategy, coordinator = start_strategy(info, config, kind, stop)
    replicas = replicas_of(info, kind, strategy, config)
    described = program.description()
    replica = Replica(strategy, coordinator, program, config, num_workers=info.num_workers,
                      agree_on_stop=kind == "multiworker")
    startup.mark("model")
    if chief and program.serving is not None and program.serving.model_fn is not None:
        # The serving model is built now, so that a model the trained weights do not fit
        # fails before the first step, not after the last.
        from mljob.training import export as export_lib
        export_lib.check_serving_model(program.serving.model_fn, {
            w.path: tuple(w.shape) for w in replica.model.weights})
    store = CheckpointStore(config.checkpoint_url, keep=config.keep_checkpoints,
                            writer=chief)
    writers = SummaryWriters(config.summary_url, enabled=chief)
    try:
        start = store.restore(replica.checkpoint) or 0
        # describe's first pair (the model) before replicas=, the rest before job_dir=,
        # where the bundled trainer has always printed them.
        head, _, rest = described.partition(" ")
        progress.line(
            f"training started: strategy={kind} step={start} train_steps="
            f"{config.train_steps} " + (f"{head} " if head else "")
            + f"replicas={replicas} batch_size={config.batch_size} steps_per_execution="
            f"{replica.steps_per_execution}"
            + (" (compile's)" if replica.steps_per_execution != config.steps_per_execution
               else "") + " " + (f"{rest} " if rest else "")
            + f"job_dir={config.job_dir}")
        if kind == "ps":
            progress.line(f"ps updates: {replica.ps_updates()}")
            progress.line("variables: " + " ".join(
                f"{path}={n}" for path, n in replica.shards().items()) + " (shards)")
        if start >= config.train_steps:
            return _already_done(replica, program, config, start, progress)
        # A resumed run reshuffles with a new seed rather than replaying the same order.
        replica.start_input(program.train_dataset_fn,
                            seed=((config.seed or 0) + start) % (2**31 - 1))
        startup.mark("input")
        loop = _Loop(replica, program, config, store, writers, progress, chief)
        with peers_answering(info, kind, "restart the job to resume from the latest "
                             "checkpoint"):
            step = loop.run(start, stop)
        if step < config.train_steps:
            why = stop.reason() if stop.requested() else "another replica was stopped"
            raise Preempted(f"stopped at step {step} ({why}); checkpoint saved, "
                            "run again to resume")
        if chief and program.serving is not None:
            url = replica_export(replica, program, config)
            progress.line(f"exported model to {url}")
        return EXIT_OK
    finally:
        writers.close()
        store.close()


def start_strategy(info: ClusterInfo, config: RunConfig, kind: str, stop: StopSignal):
    """Wait for the cluster, then (strategy, coordinator or None), with the stop signal
    installed; Preempted when stopped while waiting."""
    if kind == "ps" and not wait_for_peers(info, stop):
        raise Preempted(f"stopped while waiting for the cluster ({stop.reason()})")
    if kind == "multiworker":
        check_collectives_can_start()
        stop.install()  # seen while waiting; TensorFlow's handler takes over below
        if not wait_for_leader(info, stop):
            raise Preempted(f"stopped while waiting for the chief ({stop.reason()})")
    startup.mark("peers")
    strategy, coordinator = make_strategy(kind, info, config.ps_shards)
    startup.mark("strategy")
    # TensorFlow's coordination service (multiworker) sets its own SIGTERM handler in
    # C++ when the strategy starts, which swallows the signal: take it back. Every
    # replica that trains takes part in the save (multiworker peers through the
    # all-reduced stop flag); the watchdog ends one whose peers never answer.
    stop.install()
    return strategy, coordinator


def replicas_of(info: ClusterInfo, kind: str, strategy, config: RunConfig) -> int:
    """The workers under ps, the replicas in sync otherwise; UsageError when a
    synchronous batch cannot be split evenly over them."""
    replicas = info.num_workers if kind == "ps" else strategy.num_replicas_in_sync
    if kind in ("multiworker", "mirrored") and config.batch_size % replicas:
        raise UsageError(f"--batch-size {config.batch_size} cannot be split evenly over "
                         f"{replicas} replicas; use a multiple of {replicas}")
    return replicas


def replica_export(replica: Replica, program: Program, config: RunConfig) -> str:
    return export_model(replica.model, program, config)


def export_model(model, program: Program, config: RunConfig) -> str:
    """The trained `model`'s weights exported with the program's Serving; the URL."""
    from mljob.training import export as export_lib
    serving = program.serving
    assert serving is not None  # the callers export only a program with a Serving
    paths = [w.path for w in model.weights]
    values = weights_numpy(model)
    # By path (export.assign_by_path); by position where the model repeats a path.
    weights = dict(zip(paths, values, strict=True)) if len(set(paths)) == len(paths) \
        else values
    return export_lib.export(serving.model_fn or program.model_fn, weights,
                             config.export_url, serving,
                             inference_signature=dict(serving.inference_signature)
                             if serving.inference_signature is not None else None)


def _already_done(replica: Replica, program: Program, config: RunConfig, step: int,
                  progress: Progress) -> int:
    progress.line(f"training finished: step={step} already_done=true")
    if progress.enabled and program.serving is not None:
        if storage.exists(storage.join(config.export_url, "saved_model.pb")):
            progress.line(f"model already exported at {config.export_url}")
        else:
            progress.line(f"exported model to {replica_export(replica, program, config)}")
    return EXIT_OK


class _Loop:
    """The step loop with its side effects at step boundaries (log, checkpoint, eval)."""

    def __init__(self, replica: Replica, program: Program, config: RunConfig,
                 store: CheckpointStore, writers: SummaryWriters, progress: Progress,
                 chief: bool):
        self.replica, self.program, self.config, self.store = replica, program, config, store
        self.writers, self.progress, self.chief = writers, progress, chief
        self._lone = None  # the chief's copy for evaluating a model's own steps alone

    def run(self, start: int, stop: StopSignal) -> int:
        cfg = self.config
        step = start
        started = time.monotonic()
        self._mark = (start, started)  # the step and time of the last log line
        loss = float("nan")
        metrics: dict[str, float] = {}
        agree = self.replica.agree_on_stop
        pending: list = []  # the chunks since the last log line, whose metrics it shows
        # Under ps the first step's line waits until the next chunk is scheduled: that
        # one goes to another worker, whose first run (setting the function up, XLA)
        # then overlaps the first worker's instead of following it.
        overlap = self.replica.coordinator is not None and self.replica.num_workers > 1
        held = False
        while step < cfg.train_steps:
            # Alone, a replica stops before a chunk; under multiworker all stop together
            # after the chunk whose all-reduce first carries a stop flag (below).
            if not agree and stop.requested():
                break
            num = 1 if step == start else min(self.replica.steps_per_execution,
                                              self._next_boundary(step) - step)
            handle = self.replica.run_chunk(num, stop=agree and stop.requested())
            if step == start:
                startup.mark("traced")
            pending.append(handle)
            step += num
            self.progress.bar(step)
            if held:  # the first step's line, now that the next chunk is on its way
                held = False
                loss, metrics = self._line(start + 1, pending[:1])
                pending = pending[1:]
            if step == start + 1 and overlap and self._next_boundary(start) > step:
                held = True  # no log line, checkpoint or evaluation is due at this step
                continue
            if step == start + 1 or step % cfg.log_every == 0 or step == cfg.train_steps:
                loss, metrics = self._line(step, pending)
                pending = []
            if step == cfg.train_steps or (agree and self.replica.stopping(handle)):
                break
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                self.save(step)
            if cfg.eval_every and step % cfg.eval_every == 0:
                self.evaluate(step)
        if step >= cfg.train_steps:  # as Keras's fit ends: EMA's averages into the model
            finalize(self.replica.optimizer, self.replica.model)
        self.save(step)
        if step >= cfg.train_steps:
            self.evaluate(step)
            shown = "".join(f" {name}={value:.4f}" for name, value in metrics.items())
            self.progress.line(
                f"training finished: step={step}"
                + ("" if loss is NO_LOSS else f" loss={loss:.4f}") + f"{shown} "
                f"seconds={time.monotonic() - started:.1f}")
        return step

    def _line(self, step: int, handles: list) -> tuple[float, dict[str, float]]:
        """The log line (and train summaries) of `step`, from the chunks of `handles`."""
        loss, metrics = self.replica.result(handles)
        now = time.monotonic()
        steps_per_sec = (step - self._mark[0]) / max(now - self._mark[1], 1e-9)
        self._mark = (step, now)
        examples = steps_per_sec * self.config.batch_size
        lr = self.replica.learning_rate() if self.chief else float("nan")
        self.progress.step(step, loss, metrics, examples, lr)
        rates = lr if isinstance(lr, dict) else {"learning_rate": lr}
        self.writers.train(step, loss=loss, **metrics, **rates,
                           steps_per_sec=steps_per_sec, examples_per_sec=examples)
        return loss, metrics

    def _next_boundary(self, step: int) -> int:
        cfg = self.config
        nearest = cfg.train_steps
        for every in (cfg.log_every, cfg.checkpoint_every, cfg.eval_every):
            if every:
                nearest = min(nearest, (step // every + 1) * every)
        return nearest

    def save(self, step: int) -> None:
        self.replica.sync()
        self.replica.step.assign(step)
        self.store.save(self.replica.checkpoint, step)
        if self.chief:
            names = [w.path for w in self.replica.model.weights]
            self.writers.histograms(step, dict(zip(names, weights_numpy(self.replica.model),
                                                       strict=True)))
            self.writers.sync()

    def evaluate(self, step: int) -> None:
        if not self.chief or self.program.eval_dataset_fn is None:
            return
        self.replica.sync()
        # The chief evaluates alone: a model compiled by the library is evaluated
        # statelessly by its loss and metrics (`checks`), never through the strategy's
        # replicas, whose metric reads would wait for the other workers.
        model, strategy = self.replica.model, self.replica.strategy
        objective = self.replica.objective or self.replica.checks
        if objective is None and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            # A model's own test_step updates and resets its trackers, whose variables
            # are the strategy's: their reset is a collective the other workers, in
            # their next chunk, never join. So the chief evaluates a copy of its own.
            model, strategy = self._lone_copy(), None
        loss, metrics = evaluate(model, self.program.eval_dataset_fn(), objective, strategy)
        self.progress.eval(step, loss, metrics)
        self.writers.eval(step, loss=loss, **metrics)
        self.writers.sync()
        hypertune.report_evaluation(step, loss=loss, metrics=metrics)  # tuning trials

    def _lone_copy(self):
        """model_fn()'s model outside the strategy, holding the trained weights now."""
        from mljob.training import export as export_lib
        if self._lone is None:
            self._lone = export_lib.built(self.program.model_fn)
        for mine, trained in zip(self._lone.weights, weights_numpy(self.replica.model),
                                 strict=True):
            mine.assign(trained)
        return self._lone


__all__ = ["run", "replica_export", "export_model", "start_strategy", "replicas_of"]
