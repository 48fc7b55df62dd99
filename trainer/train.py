"""Strategy choice and the training loop of every replica that trains.

| strategy | made from | who runs this loop |
|---|---|---|
| single | the default strategy | this process |
| mirrored | `MirroredStrategy` over the local GPUs | this process |
| multiworker | `MultiWorkerMirroredStrategy` (synchronous all-reduce) | chief and every worker |
| ps | `ParameterServerStrategy` + `ClusterCoordinator` (asynchronous) | the chief, scheduling steps on the workers |

Keras 3's `model.fit` does not run under the two multi-worker strategies, so the loop is
written here: one `tf.function` runs `--steps-per-execution` steps and returns only the
last step's loss and accuracy (under ps it is one scheduled function: the coordinator
costs about 10 ms per function, a step of the MLP about 1 ms).

Only the chief writes (checkpoints, summaries, the export); the other multiworker replicas
take part in every save (TensorFlow's pattern) but write to temp dirs they delete.

Stopping under multiworker: a replica that gets SIGTERM (or loses its launcher) only
sets a flag. Each chunk all-reduces every replica's flag after its last step, so all
replicas learn of a stop at the end of the same chunk, save the same step together and
exit 143. Replicas never decide alone: one that left the step loop early would leave the
others waiting in a collective. (TensorFlow's `PreemptionCheckpointHandler` does the same
through the coordination service, but saves with its own checkpoint manager, not to our
job dir, and exits by itself.)
"""
from __future__ import annotations

import dataclasses
import time

import keras
import tensorflow as tf

from trainer import data as data_lib
from trainer import model as model_lib
from mljob import storage
from trainer.checkpoints import CheckpointStore
from mljob.cluster import ClusterInfo
from trainer.errors import EXIT_OK, EXIT_PREEMPTED, PeerUnavailableError, TrainerError, \
    UsageError
from trainer.evaluator import evaluate
from trainer.servers import StopSignal
from trainer.strategies import make_strategy, peer_named_in, wait_for_peers, weight_parts, \
    weights_numpy, worker_shard_dataset
from trainer.summaries import Progress, SummaryWriters

# Steps run by one tf.function call (one scheduled function under ps). 20 keeps the
# coordinator's ~10 ms per function under a third of a CPU step of the MLP at batch 100,
# while a log line still comes every few chunks. bench/ tunes it.
STEPS_PER_EXECUTION = 20


class Preempted(TrainerError):
    """Stopped by SIGTERM/SIGINT or the launcher's death, after saving a checkpoint."""

    exit_status = EXIT_PREEMPTED


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The trainer's flags, validated (see docs/trainer.md for each), and where the
    outputs go: trainer.task resolves the three URLs once (Vertex AI's AIP_* variables
    may move them out of the job dir); left empty they are the job dir's own folders."""

    job_dir: str
    export_url: str = ""            # the SavedModel; default <job-dir>/model
    checkpoint_url: str = ""        # default <job-dir>/checkpoints
    summary_url: str = ""           # default <job-dir>/summaries (train/ and eval/ in it)
    model: str = "cnn"
    train_steps: int = 2000
    batch_size: int = 100
    learning_rate: float = 1e-3
    eval_every: int = 1000          # 0: evaluate only at the end
    checkpoint_every: int = 500     # 0: checkpoint only at the end (and when stopped)
    keep_checkpoints: int = 5
    steps_per_execution: int = STEPS_PER_EXECUTION
    ps_shards: int = 0              # 0: automatic, 1: no sharding, N: N shards
    strategy: str = "auto"
    data_dir: str | None = None
    train_files: str | None = None
    eval_files: str | None = None
    log_every: int = 100
    seed: int | None = None
    dropout: float = 0.4
    mixed_precision: str = "off"    # or "mixed_bfloat16"; variables stay float32

    def __post_init__(self):
        for field, folder in (("export_url", "model"), ("checkpoint_url", "checkpoints"),
                              ("summary_url", "summaries")):
            if not getattr(self, field):
                object.__setattr__(self, field, storage.join(self.job_dir, folder))


class Replica:
    """The model, its optimizer and step, and the compiled chunk of training steps."""

    def __init__(self, strategy, coordinator, config: TrainConfig, num_workers: int = 1,
                 *, agree_on_stop: bool = False):
        self.strategy, self.coordinator, self.config = strategy, coordinator, config
        self.num_workers = num_workers
        # Under multiworker every chunk all-reduces the replicas' stop flags (see above).
        self.agree_on_stop = agree_on_stop
        with strategy.scope():
            self.model = model_lib.build(config.model, dropout=config.dropout,
                                         seed=config.seed,
                                         precision=config.mixed_precision)
            self.optimizer = keras.optimizers.Adam(config.learning_rate)
            self.parts = [p for w in self.model.trainable_weights for p in weight_parts(w)]
            self.optimizer.build(self.parts)
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        # The model's variables by their Keras path, not the Keras objects: a Keras
        # variable holding a ShardedVariable cannot be saved, the ShardedVariable can,
        # and it restores into unsharded variables (the evaluator, a single-node resume).
        self.checkpoint = tf.train.Checkpoint(
            model={w.path: w.value for w in self.model.weights},
            optimizer=list(self.optimizer.variables), step=self.step)
        self._chunk = tf.function(self._train_chunk)
        self._iterator = None

    def shards(self) -> dict[str, int]:
        return {w.path: len(weight_parts(w)) for w in self.model.weights}

    def start_input(self, dataset: data_lib.Dataset, seed: int) -> None:
        """Build the input pipelines: per worker under ps, per replica otherwise."""
        images, labels = dataset.train_images, dataset.train_labels
        batch = self.config.batch_size
        if self.coordinator is not None:
            num_workers = self.num_workers

            def dataset_fn():
                index = tf.distribute.coordinator.experimental_get_current_worker_index()
                return worker_shard_dataset(images, labels, batch, index, num_workers, seed)

            per_worker = self.coordinator.create_per_worker_dataset(dataset_fn)
            self._iterator = iter(per_worker)
            return

        def replica_fn(context: tf.distribute.InputContext):
            return data_lib.train_dataset(
                images, labels, context.get_per_replica_batch_size(batch),
                shard_index=context.input_pipeline_id,
                num_shards=context.num_input_pipelines, seed=seed)

        self._iterator = iter(self.strategy.distribute_datasets_from_function(replica_fn))

    def _train_step(self, images, labels):
        with tf.GradientTape() as tape:
            logits = self.model(images, training=True)
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
            # --batch-size examples a step: split over the replicas under multiworker
            # and mirrored (whose SUM of these is the mean), one worker's batch under ps.
            loss = tf.nn.compute_average_loss(per_example,
                                              global_batch_size=self.config.batch_size)
        grads = tape.gradient(loss, self.parts)
        self.optimizer.apply_gradients(zip(grads, self.parts))
        correct = tf.cast(tf.equal(tf.argmax(logits, axis=1), labels), tf.float32)
        return loss, tf.reduce_mean(correct)

    def _train_chunk(self, iterator, num_steps, stop_flag):
        # Steps before the last return nothing: fetching values costs a round trip.
        for _ in tf.range(num_steps - 1):
            self.strategy.run(self._train_step, args=next(iterator))
        loss, accuracy = self.strategy.run(self._train_step, args=next(iterator))
        sum_, mean = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN
        stops = stop_flag
        if self.agree_on_stop:  # how many replicas were asked to stop, the same on all
            stops = self.strategy.run(_all_replicas_sum, args=(stop_flag,))
            stops = self.strategy.experimental_local_results(stops)[0]
        return (self.strategy.reduce(sum_, loss, axis=None),
                self.strategy.reduce(mean, accuracy, axis=None), stops)

    def run_chunk(self, num_steps: int, stop: bool = False):
        """Run (or, under ps, schedule) num_steps steps; a handle for `result`. `stop`
        is this replica's stop flag, which `stopping(handle)` reports agreed on."""
        n = tf.constant(num_steps, dtype=tf.int32)
        flag = tf.constant(1.0 if stop else 0.0)
        if self.coordinator is not None:
            return self.coordinator.schedule(self._chunk, args=(self._iterator, n, flag))
        return self._chunk(self._iterator, n, flag)

    def result(self, handle) -> tuple[float, float]:
        if self.coordinator is not None:
            loss, accuracy, _ = handle.fetch()
        else:
            loss, accuracy, _ = handle
        return float(loss), float(accuracy)

    def stopping(self, handle) -> bool:
        """Under multiworker: whether any replica asked to stop before this chunk ran
        (every replica gets the same answer, from the chunk's all-reduce)."""
        return float(handle[2]) > 0

    def sync(self) -> None:
        """Wait until every scheduled step has run (under ps); a no-op otherwise."""
        if self.coordinator is not None:
            self.coordinator.join()


def run(info: ClusterInfo, config: TrainConfig, kind: str, stop: StopSignal) -> int:
    """Train to config.train_steps (resuming from the latest checkpoint), then export.
    Returns the exit status; raises TrainerError subclasses for the rest."""
    chief = info.is_chief
    progress = Progress(config.train_steps, enabled=chief)
    if kind == "ps" and not wait_for_peers(info, stop):
        raise Preempted(f"stopped while waiting for the cluster ({stop.reason()})")
    strategy, coordinator = make_strategy(kind, info, config.ps_shards)
    # TensorFlow's coordination service (multiworker) sets its own SIGTERM handler in
    # C++ when the strategy starts, which swallows the signal: take it back. Every
    # replica that trains takes part in the save (multiworker peers through the
    # all-reduced stop flag); the watchdog ends one whose peers never answer.
    stop.install()
    replicas = info.num_workers if kind == "ps" else strategy.num_replicas_in_sync
    if kind in ("multiworker", "mirrored") and config.batch_size % replicas:
        raise UsageError(f"--batch-size {config.batch_size} cannot be split evenly over "
                         f"{replicas} replicas; use a multiple of {replicas}")
    dataset = data_lib.load(config.data_dir, config.train_files, config.eval_files)
    if config.batch_size > len(dataset.train_labels):  # no full batch: no step would run
        raise UsageError(f"--batch-size {config.batch_size} is more than the "
                         f"{len(dataset.train_labels)} training examples; use a smaller one")
    replica = Replica(strategy, coordinator, config, num_workers=info.num_workers,
                      agree_on_stop=kind == "multiworker")
    store = CheckpointStore(config.checkpoint_url, keep=config.keep_checkpoints,
                            writer=chief)
    writers = SummaryWriters(config.summary_url, enabled=chief)
    try:
        start = store.restore(replica.checkpoint) or 0
        progress.line(
            f"training started: strategy={kind} step={start} train_steps="
            f"{config.train_steps} model={config.model} replicas={replicas} "
            f"batch_size={config.batch_size} steps_per_execution="
            f"{config.steps_per_execution} mixed_precision={config.mixed_precision} "
            f"data={dataset.source!r} job_dir={config.job_dir}")
        if kind == "ps":
            progress.line("variables: " + " ".join(
                f"{path}={n}" for path, n in replica.shards().items()) + " (shards)")
        if start >= config.train_steps:
            return _already_done(replica, config, start, progress)
        # A resumed run reshuffles with a new seed rather than replaying the same order.
        replica.start_input(dataset, seed=((config.seed or 0) + start) % (2**31 - 1))
        loop = _Loop(replica, config, store, writers, progress, dataset, chief)
        try:
            step = loop.run(start, stop)
        except (tf.errors.UnavailableError, tf.errors.AbortedError,
                tf.errors.DeadlineExceededError) as exc:
            if kind not in ("ps", "multiworker"):
                raise
            raise PeerUnavailableError(
                f"{peer_named_in(str(exc), info)} stopped answering; restart the job to "
                "resume from the latest checkpoint") from None
        if step < config.train_steps:
            why = stop.reason() if stop.requested() else "another replica was stopped"
            raise Preempted(f"stopped at step {step} ({why}); checkpoint saved, "
                            "run again to resume")
        if chief:
            url = replica_export(replica, config)
            progress.line(f"exported model to {url}")
        return EXIT_OK
    finally:
        writers.close()
        store.close()


def _all_replicas_sum(value):
    # A tensor of this replica's own (identity): the argument itself, the same object on
    # every local replica, has no device for MultiWorkerMirroredStrategy to reduce to.
    return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM,
                                                          tf.identity(value))


def replica_export(replica: Replica, config: TrainConfig) -> str:
    from trainer import export as export_lib
    return export_lib.export(config.model, weights_numpy(replica.model), config.export_url)


def _already_done(replica: Replica, config: TrainConfig, step: int,
                  progress: Progress) -> int:
    progress.line(f"training finished: step={step} already_done=true")
    if progress.enabled:
        if storage.exists(storage.join(config.export_url, "saved_model.pb")):
            progress.line(f"model already exported at {config.export_url}")
        else:
            progress.line(f"exported model to {replica_export(replica, config)}")
    return EXIT_OK


class _Loop:
    """The step loop with its side effects at step boundaries (log, checkpoint, eval)."""

    def __init__(self, replica: Replica, config: TrainConfig, store: CheckpointStore,
                 writers: SummaryWriters, progress: Progress, dataset, chief: bool):
        self.replica, self.config, self.store = replica, config, store
        self.writers, self.progress, self.dataset, self.chief = (
            writers, progress, dataset, chief)

    def run(self, start: int, stop: StopSignal) -> int:
        cfg = self.config
        step, mark_step, mark_time = start, start, time.monotonic()
        started = time.monotonic()
        loss = accuracy = float("nan")
        agree = self.replica.agree_on_stop
        while step < cfg.train_steps:
            # Alone, a replica stops before a chunk; under multiworker all stop together
            # after the chunk whose all-reduce first carries a stop flag (below).
            if not agree and stop.requested():
                break
            num = 1 if step == start else min(cfg.steps_per_execution,
                                              self._next_boundary(step) - step)
            handle = self.replica.run_chunk(num, stop=agree and stop.requested())
            step += num
            self.progress.bar(step)
            if step == start + 1 or step % cfg.log_every == 0 or step == cfg.train_steps:
                loss, accuracy = self.replica.result(handle)
                now = time.monotonic()
                steps_per_sec = (step - mark_step) / max(now - mark_time, 1e-9)
                mark_step, mark_time = step, now
                examples = steps_per_sec * cfg.batch_size
                self.progress.step(step, loss, accuracy, examples, cfg.learning_rate)
                self.writers.train(step, loss=loss, accuracy=accuracy,
                                   learning_rate=cfg.learning_rate,
                                   steps_per_sec=steps_per_sec, examples_per_sec=examples)
            if step == cfg.train_steps or (agree and self.replica.stopping(handle)):
                break
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                self.save(step)
            if cfg.eval_every and step % cfg.eval_every == 0:
                self.evaluate(step)
        self.save(step)
        if step >= cfg.train_steps:
            self.evaluate(step)
            self.progress.line(
                f"training finished: step={step} loss={loss:.4f} accuracy={accuracy:.4f} "
                f"seconds={time.monotonic() - started:.1f}")
        return step

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
            self.writers.histograms(step, dict(zip(names, weights_numpy(self.replica.model))))
            self.writers.sync()

    def evaluate(self, step: int) -> None:
        if not self.chief:
            return
        self.replica.sync()
        loss, accuracy = evaluate(self.replica.model, self.dataset)
        self.progress.eval(step, loss, accuracy)
        self.writers.eval(step, loss=loss, accuracy=accuracy)
        self.writers.sync()


__all__ = ["TrainConfig", "STEPS_PER_EXECUTION", "Preempted", "Replica", "run"]
