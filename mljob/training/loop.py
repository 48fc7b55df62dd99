"""The training loop of every replica that trains, for any Keras 3 model.

| strategy | made from | who runs this loop |
|---|---|---|
| single | the default strategy | this process |
| mirrored | `MirroredStrategy` over the local GPUs | this process |
| multiworker | `MultiWorkerMirroredStrategy` (synchronous all-reduce) | chief and every worker |
| ps | `ParameterServerStrategy` + `ClusterCoordinator` (async) | the chief, scheduling steps |

Keras 3's `model.fit` does not run under the two multi-worker strategies, so the loop is
written here: one `tf.function` runs `steps_per_execution` steps and returns only the
last step's loss and metrics (under ps it is one scheduled function: the coordinator
costs about 10 ms per function, a step of the bundled MLP about 1 ms).

The user's data comes from `train_dataset_fn(context)`, one input pipeline per worker
under ps (built on the worker, `context.input_pipeline_id` its index as a tensor) and per
replica otherwise (`distribute_datasets_from_function`). `context.seed` changes with the
step a run resumes from, so a resumed run reshuffles rather than replaying the same order.
This module is the `Replica` (the model, its optimizer and the chunk functions); the run
around it (the cluster, checkpoints, the step boundaries, the export) is
`mljob.training.steps`.

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

import keras
import numpy as np
import tensorflow as tf

from mljob.training import export as export_lib
from mljob.training import model_optimizers, own_steps
from mljob.training.checkpoints import seed_states
from mljob.training.config import Program, RunConfig
from mljob.training.errors import UsageError
from mljob.training.input_context import InputContext
from mljob.training.keras_private import adam_slots, learning_rate_setting, \
    regularization_losses, scale_loss_for_distribution, tree, unscale_loss_for_distribution
from mljob.training.losses import compiled_optimizer, merge_rule, one_replica, unpack
from mljob.training.precision import WIRE_BFLOAT16, wire_dtype
from mljob.training.shared_state import add_change, atomic_iterations, keeping_state, \
    tf_variable as _tf_variable
from mljob.training.strategies import weight_parts
from mljob.training.optimizers import make_optimizer, steps_per_execution
from mljob.training.updates import adam_step, fusable, fuse


class Replica:
    """The model, its optimizer and step, and the compiled chunk of training steps."""

    def __init__(self, strategy, coordinator, program: Program, config: RunConfig,
                 num_workers: int = 1, *, agree_on_stop: bool = False):
        self.strategy, self.coordinator, self.config = strategy, coordinator, config
        self.class_weight = program.class_weight  # Keras's step: mapped into the data
        self.num_workers = num_workers
        # Under multiworker every chunk all-reduces the replicas' stop flags (see above).
        self.agree_on_stop = agree_on_stop
        with strategy.scope():
            self.model = export_lib.built(program.model_fn)  # names as the export's
            if not isinstance(self.model, keras.Model):
                raise UsageError(f"model_fn gave {type(self.model).__name__}, not a Keras "
                                 "model; return a keras.Model with its weights built")
            # A model's own train_step/test_step is run as Keras runs it (own_steps); a
            # GAN's is never called as a whole, but its parts are built.
            own = own_steps.uses_own_steps(self.model)
            if not self.model.weights or not (self.model.built or own):
                raise UsageError("model_fn's model has no weights yet; build it (give "
                                 "its Input shapes, or call model.build) before returning")
            if own:
                own_steps.check(self.model, program, parameter_servers=coordinator is not None,
                                replicas=strategy.num_replicas_in_sync)
            # On one node, the optimizers a model's own step builds lazily are built now
            # (model_optimizers), so that the checkpoint holds them.
            self.step_optimizers = model_optimizers.build_in_step(
                self.model, program.train_dataset_fn(InputContext(
                    global_batch_size=config.batch_size, seed=0)).element_spec) \
                if own and coordinator is None and \
                strategy.num_replicas_in_sync == 1 else []
            self.optimizer = make_optimizer(program.optimizer) \
                if program.optimizer is not None else compiled_optimizer(self.model)
            # One node and synchronous replicas run Keras's own train_step, the model
            # compiled with the run's loss, metrics and optimizer (exactly `fit`'s step, by
            # construction); parameter servers keep the step written here.
            # `checks`: the run's loss and metrics as this library resolves them, which
            # names what does not fit the data in one line (start_input) before Keras's
            # step would fail at tracing.
            self.checks = None
            if coordinator is None and not own:
                self.checks = program.objective(self.model)
                own_steps.compile_for_keras(self.model, program, self.optimizer,
                                            self.checks)
                # One process, one replica, plain Adam: Keras's step with Adam's
                # update fused by XLA, exactly Keras's (updates.fuse); synchronous
                # replicas keep Keras's update, which all-reduces the gradients.
                parts = [p for w in self.model.trainable_weights for p in weight_parts(w)]
                if strategy.num_replicas_in_sync == 1 and \
                        strategy is tf.distribute.get_strategy() and \
                        fusable(self.optimizer, parts):
                    fuse(self.optimizer)
            self.own_steps = own or coordinator is None
            model_optimizers.check_synchronous_options(self.optimizer, strategy, coordinator,
                                                       self.model)
            self.parts = [p for w in self.model.trainable_weights for p in weight_parts(w)]
            if not self.optimizer.built and not self.step_optimizers:
                self.optimizer.build(self.parts)
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        # What compile was given, unless the arguments say otherwise (Objective.of); its
        # metrics made here, outside the scope: only their states travel. A model with
        # its own steps has its own loss and metrics.
        self.objective = None if self.own_steps else program.objective(self.model)
        # compile(steps_per_execution=N) is honoured unless the run's config sets its own.
        self.steps_per_execution = steps_per_execution(self.model, config)
        # The model's variables by their Keras path, not the Keras objects: a Keras
        # variable holding a ShardedVariable cannot be saved, the ShardedVariable can,
        # and it restores into unsharded variables (the evaluator, a single-node resume).
        optimizer_variables = [v for o in ([o for _, o in model_optimizers.named(self.model)]
                                           if self.own_steps else [self.optimizer])
                               for v in o.variables]
        self.checkpoint = tf.train.Checkpoint(
            model={w.path: w.value for w in self.model.weights},
            optimizer=optimizer_variables, step=self.step, seeds=seed_states(self.model))
        # autograph=False, as Keras's fit traces its steps: the loops are TensorFlow's
        # own (tf.while_loop), and converting this code and everything it calls took
        # two thirds of the first chunk's tracing (seconds before the first step).
        self._chunk = tf.function(self._own_chunk if self.own_steps else self._train_chunk,
                                  autograph=False)
        # A model's own first step alone: an optimizer it builds on first use (one node)
        # makes its variables there, not inside the chunk's loop.
        self._first = tf.function(self._own_first, autograph=False) if self.own_steps \
            else None
        self._iterator = None
        # Under ps, local steps are on unless turned off, where the update they run on
        # the workers is exactly Keras's (plain Adam, the single node's `fusable`); any
        # other optimizer, or Adam with one of its options, steps one at a time through
        # the optimizer's own apply. Asked for where they are not exact, they are an error.
        exact = fusable(self.optimizer, self.parts)
        if config.ps_local_steps and not exact and coordinator is not None:
            shown = model_optimizers.optimizer_text(self.optimizer, self.model)
            raise UsageError(f"ps_local_steps runs plain Adam's update on the workers, "
                             f"not {shown}'s: give "
                             "keras.optimizers.Adam without amsgrad, clipping, weight "
                             "decay, EMA, accumulation or loss scaling, or turn it off")
        self.local_steps = coordinator is not None and config.ps_local_steps is not False \
            and exact
        if coordinator is not None:  # Keras's own apply and the local steps alike
            atomic_iterations(self.optimizer)
        # What each read of the ps's weights and write of their change carries on the
        # wire: with local steps, bfloat16 where the CPU computes it well, unless told
        # (precision.wire_dtype; wire_dtype None: float32).
        self.wire = wire_dtype(config.ps_wire_dtype, self.local_steps)
        self.wire_dtype = tf.bfloat16 if self.wire.dtype == WIRE_BFLOAT16 else None
        if self.wire_dtype is not None and coordinator is not None and not self.local_steps:
            raise UsageError("ps_wire_dtype bfloat16 packs the reads and writes of local "
                             "steps, which are off here (ps_local_steps=False, or not "
                             "Adam); leave ps_wire_dtype unset or float32")
        self.merge = config.ps_merge or "sqrt"
        if config.ps_merge is not None and coordinator is not None and not self.local_steps:
            raise UsageError(f"ps_merge {config.ps_merge} merges the changes of local "
                             "steps, which are off here (ps_local_steps=False, or not "
                             "Adam); leave ps_merge unset")
        if self.local_steps:
            self._chunk = tf.function(self._local_chunk, autograph=False)

    def ps_updates(self) -> str:
        """How the workers update the ps, for the chief's started lines."""
        if not self.local_steps:
            return "step by step (one read and one update of every variable a step)"
        wire = f"{self.wire.dtype} on the wire" + (
            f" ({self.wire.reason.removeprefix('auto: ')})"
            if self.wire.reason.startswith("auto:") and self.wire_dtype is None else "")
        workers = f"{self.num_workers} worker{'' if self.num_workers == 1 else 's'}"
        weights = {"sqrt": f"summed / sqrt({self.num_workers})", "mean": "averaged"}[
            self.merge]
        return (f"local steps ({self.steps_per_execution} a function, {workers}: "
                f"weight changes {weights}, moments averaged, {wire})")

    def shards(self) -> dict[str, int]:
        return {w.path: len(weight_parts(w)) for w in self.model.weights}

    def learning_rate(self) -> float | dict[str, float]:
        """The rate of the optimizer the steps apply; of each, by attribute, when a
        model's own step applies several (`model_optimizers`)."""
        used = self.step_optimizers or [("", self.optimizer)]
        if len(used) == 1:
            return model_optimizers.learning_rate(used[0][1])
        return {f"{name}_lr": model_optimizers.learning_rate(o) for name, o in used}

    def start_input(self, train_dataset_fn, seed: int) -> None:
        """Build the input pipelines: per worker under ps, per replica otherwise."""
        batch = self.config.batch_size
        if self.coordinator is not None:
            num_workers = self.num_workers

            def dataset_fn():
                index = tf.cast(
                    tf.distribute.coordinator.experimental_get_current_worker_index(),
                    tf.int64)  # what Dataset.shard takes
                return train_dataset_fn(InputContext(num_workers, index, 1,
                                                     global_batch_size=batch, seed=seed))

            per_worker = self.coordinator.create_per_worker_dataset(dataset_fn)
            assert self.objective is not None  # own steps are refused under ps
            self.objective.build(self.model, per_worker.element_spec)
            self._iterator = iter(per_worker)
            return

        class_weight = self.class_weight if self.checks is not None else None
        given = []  # the element spec train_dataset_fn gives, before class weights

        def replica_fn(context: tf.distribute.InputContext):
            dataset = train_dataset_fn(InputContext.from_tf(context, batch, seed))
            given.append(dataset.element_spec)
            weighted = isinstance(dataset.element_spec, tuple) and \
                len(dataset.element_spec) == 3  # the checks below refuse both
            return dataset if weighted else own_steps.with_class_weight(dataset,
                                                                       class_weight)

        distributed = self.strategy.distribute_datasets_from_function(replica_fn)
        checks = self.objective or self.checks
        if checks is not None:
            checks.build(self.model, one_replica(given[0]) if given
                         else one_replica(distributed.element_spec))
        if self.checks is not None:
            # What Keras's fit builds before its first step (the compiled metrics and
            # loss, the optimizer), from the data's shapes: never inside a step.
            own_steps.build_for_keras(self.model, self.strategy,
                                      one_replica(distributed.element_spec))
        self._iterator = iter(distributed)

    def _train_step(self, *data, metric_state=None):
        """One step as Keras's `fit` takes it: Keras's losses are their batch's mean
        already scaled by 1/replicas in a replica context (so the replicas' gradients sum
        to the global batch's), the layers' losses scaled the same, the optimizer's own
        apply with every option it has. Under ps the layers' state (BatchNormalization's
        moving statistics, counters) is added to the ps as this step's change, never
        overwritten (`shared_state.keeping_state`)."""
        features, labels, weights = unpack(data)
        state = self.model.non_trainable_variables if self.coordinator is not None else []
        with tf.GradientTape() as tape:
            with keeping_state(state) as kept:
                outputs = self.model(features, training=True)
            # add_loss's terms (held by the scope under ps) and the weights' regularizers
            extra = kept.losses + regularization_losses(self.model) if state \
                else self.model.losses
            if self.objective.class_weight is not None:
                weights = self.objective.class_weights(tree.flatten(labels)[0])
            loss, each = self.objective.loss(labels, outputs, weights)
            if extra:  # the layers' regularizers, in the loss as in Keras
                loss += scale_loss_for_distribution(
                    tf.add_n([tf.cast(x, tf.float32) for x in extra]))
            scaled_for_grads = self.optimizer.scale_loss(loss)
        grads = tape.gradient(scaled_for_grads, self.parts)
        self.optimizer.apply_gradients(zip(grads, self.parts, strict=True))
        kept.add_changes()
        # The metrics see the losses unscaled, as Keras's loss tracker does.
        state = self.objective.update(self.objective.zero_state() if metric_state is None
                                      else metric_state, labels, outputs,
                                      weights, [unscale_loss_for_distribution(e)
                                                for e in each],
                                      unscale_loss_for_distribution(loss))
        return loss, state

    def _own_first(self, iterator, num_steps, stop_flag):
        del num_steps  # always one
        return self._own_result(self.strategy.run(self.model.train_step,
                                                  args=(next(iterator),)), stop_flag)

    def _own_chunk(self, iterator, num_steps, stop_flag):
        """num_steps of the model's own train_step (own_steps)."""
        def step(i):
            self.strategy.run(self.model.train_step, args=(next(iterator),))
            return i + 1

        tf.while_loop(lambda i: i < num_steps - 1, step, [tf.constant(0)])
        logs = self.strategy.run(self.model.train_step, args=(next(iterator),))
        return self._own_result(logs, stop_flag)

    def _own_result(self, logs, stop_flag):
        return tf.constant(0.0), own_steps.reduce_logs(logs, self.strategy), \
            self._agreed_stops(stop_flag)

    def _agreed_stops(self, stop_flag):
        if not self.agree_on_stop:
            return stop_flag
        # How many replicas were asked to stop, the same on all.
        stops = self.strategy.run(_all_replicas_sum, args=(stop_flag,))
        return self.strategy.experimental_local_results(stops)[0]

    def _read(self, var):
        """A variable's value on this worker; with ps_wire_dtype bfloat16 it is rounded
        to bfloat16 on the ps, so half the bytes cross the wire."""
        var = _tf_variable(var)
        if self.wire_dtype is None or not var.dtype.is_floating:
            return tf.identity(var)
        with tf.device(var.device):
            packed = tf.cast(var, self.wire_dtype)
        return tf.cast(packed, var.dtype)

    def _merge(self, var, change) -> None:
        """Add a change computed on this worker to a variable on the ps, in one
        AssignAdd there (in bfloat16 on the wire with ps_wire_dtype bfloat16: the change,
        not the variable, is rounded, so the ps keeps float32 values and loses under 0.4%
        of each update)."""
        var = _tf_variable(var)
        if self.wire_dtype is not None and var.dtype.is_floating:
            change = tf.cast(change, self.wire_dtype)
        with tf.device(var.device):
            var.assign_add(tf.cast(change, var.dtype))

    def _train_chunk(self, iterator, num_steps, stop_flag):
        if self.coordinator is not None:
            return self._ps_chunk(iterator, num_steps, stop_flag)
        # Steps before the last return nothing: fetching values costs a round trip.
        def step(i):
            self.strategy.run(self._train_step, args=next(iterator))
            return i + 1

        tf.while_loop(lambda i: i < num_steps - 1, step, [tf.constant(0)])
        loss, state = self.strategy.run(self._train_step, args=next(iterator))
        # The replicas' metric states merged by each variable's aggregation (the one
        # table, losses.MERGE_RULES, that also merges the chunks' states).
        merged = [self._reduce(merge_rule(how), value)
                  for how, value in zip(self.objective.aggregations, state, strict=True)]
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None), merged, \
            self._agreed_stops(stop_flag)

    def _ps_chunk(self, iterator, num_steps, stop_flag):
        """Under ps, step by step: the metric states carried through the chunk's steps,
        so a line (and `fit`'s epoch logs) covers every step, as Keras's metrics do."""
        def step(i, _loss, state):
            loss, state = self.strategy.run(
                lambda *data: self._train_step(*data, metric_state=list(state)),
                args=next(iterator))
            return i + 1, loss, state

        _, loss, state = tf.while_loop(lambda i, *_: i < num_steps, step, (
            tf.constant(0), tf.constant(0.0), self.objective.zero_state()))
        return loss, state, stop_flag

    def _reduce(self, rule: str, value):
        if rule == "first":
            return self.strategy.experimental_local_results(value)[0]
        op = tf.distribute.ReduceOp.SUM if rule == "sum" else tf.distribute.ReduceOp.MEAN
        return self.strategy.reduce(op, value, axis=None)

    def _local_chunk(self, iterator, num_steps, stop_flag):
        """ps_local_steps: the scheduled function reads the weights and Adam's state
        from the ps once, runs its num_steps steps on this worker's copy (Adam exactly as
        Keras computes it), then adds its change to the ps: the weights' change divided
        by sqrt(N) for N workers, Adam's moments' divided by N. With one worker this is
        the same training as one step at a time. With N, the workers' functions overlap
        (they start from nearly the same weights), so their mean change is one step on
        an N times larger batch, and Adam's square-root rule scales such a step by
        sqrt(N): the ps moves by the sum of the changes over sqrt(N). The moments are
        averages, so they take the mean of the workers' (summing them made the MLP
        collapse to 22-81%). bench/ps_merge.py measures the rules: with 2, 4 and 8
        workers sqrt(N) stayed within 0.11 points of step by step, the weights' mean
        (1/N, --ps-merge mean) ended 0.9 to 2.5 points below, and their sum diverged
        with 4 workers."""
        opt = self.optimizer
        moments, velocities = adam_slots(opt, self.parts)
        state = self.model.non_trainable_variables
        start = [[self._read(v) for v in group] for group in (self.parts, moments, velocities)]
        start.append([tf.identity(_tf_variable(v)) for v in state])
        t0 = tf.identity(opt.iterations)
        # A schedule is Keras's function of the step count: each local step takes its
        # own step's rate, as it would stepping one at a time.
        setting = learning_rate_setting(opt)
        schedule = setting if isinstance(
            setting, keras.optimizers.schedules.LearningRateSchedule) else None
        lr = tf.cast(opt.learning_rate, tf.float32)
        b1, b2, eps = opt.beta_1, opt.beta_2, opt.epsilon

        objective = self.objective

        def step(i, weights, ms, vs, ns, _loss, metric_state):
            features, labels, sample_weight = unpack(next(iterator))
            if objective.class_weight is not None:
                sample_weight = objective.class_weights(tree.flatten(labels)[0])
            with tf.GradientTape() as tape:
                tape.watch(weights)
                outputs, ns, extra = self._stateless_forward(features, weights, ns)
                mean_loss, each = objective.loss(labels, outputs, sample_weight)
                loss = mean_loss
                if extra:  # the layers' regularizers
                    loss += scale_loss_for_distribution(
                        tf.add_n([tf.cast(x, tf.float32) for x in extra]))
            grads = tape.gradient(loss, weights)
            t = tf.cast(t0 + tf.cast(i, t0.dtype) + 1, tf.float32)
            rate = lr if schedule is None else tf.cast(
                schedule(t0 + tf.cast(i, t0.dtype)), tf.float32)
            alpha = rate * tf.sqrt(1 - tf.pow(b2, t)) / (1 - tf.pow(b1, t))
            weights, ms, vs = adam_step(weights, ms, vs, grads, alpha, b1, b2, eps)
            metric_state = objective.update(metric_state, labels, outputs, sample_weight,
                                            each, mean_loss)
            return i + 1, weights, ms, vs, ns, loss, metric_state

        _, *end, loss, metric_state = tf.while_loop(
            lambda i, *_: i < num_steps, step,
            (tf.constant(0), *start, tf.constant(0.0), objective.zero_state()))
        weight_share = self.num_workers ** (-0.5 if self.merge == "sqrt" else -1.0)
        shares = (weight_share, 1.0 / self.num_workers, 1.0 / self.num_workers)
        for group, share, before, after in zip((self.parts, moments, velocities), shares,
                                               start, end, strict=False):
            for var, old, new in zip(group, before, after, strict=True):
                self._merge(var, (new - old) * share)
        # The layers' state and the step count as this function's change, added on the
        # ps: another worker's change made meanwhile is kept, not overwritten.
        for var, old, new in zip(state, start[3], end[3], strict=True):
            add_change(var, old, new)
        opt.iterations.assign_add(num_steps)  # atomic on the ps (atomic_iterations)
        return loss, metric_state, stop_flag

    def _stateless_forward(self, features, weights, state_values):
        """The model on the given weight parts and non-trainable values: (outputs, the
        non-trainable values after the call (dropout's seed), the layers' losses)."""
        state = self.model.non_trainable_variables
        mapping, at = list(zip(state, state_values, strict=True)), 0
        for w in self.model.trainable_weights:
            n = len(weight_parts(w))
            parts = weights[at:at + n]
            at += n
            mapping.append((w, parts[0] if n == 1 else tf.concat(parts, axis=0)))
        with keras.StatelessScope(state_mapping=mapping, collect_losses=True) as scope:
            outputs = self.model(features, training=True)
            # The weights' regularizers, on the weights given (the scope holds only
            # add_loss's terms: Keras computes regularizers when `losses` is read).
            regularization = regularization_losses(self.model)
        after = [scope.get_current_value(v) for v in state]
        return (outputs, [a if a is not None else b
                          for a, b in zip(after, state_values, strict=True)],
                list(scope.losses) + list(regularization))

    def run_chunk(self, num_steps: int, stop: bool = False):
        """Run (or, under ps, schedule) num_steps steps; a handle for `result`. `stop`
        is this replica's stop flag, which `stopping(handle)` reports agreed on."""
        n = tf.constant(num_steps, dtype=tf.int32)
        flag = tf.constant(1.0 if stop else 0.0)
        if self.coordinator is not None:
            return self.coordinator.schedule(self._chunk, args=(self._iterator, n, flag))
        if self._first is not None and num_steps == 1:
            return self._first(self._iterator, n, flag)
        return self._chunk(self._iterator, n, flag)

    def result(self, handles) -> tuple[float, dict[str, float]]:
        """(loss, metrics) over the chunks of `handles`: the metric states of each (every
        replica's, every worker's) merged, then Keras's result of the merged state; the
        loss is the mean loss of the same batches."""
        fetched = [h.fetch() if self.coordinator is not None else h for h in handles]
        if self.own_steps:  # Keras's step: the trackers' values since the last line
            return own_steps.results(self.model, fetched[-1][1])
        states = [[np.asarray(v) for v in state] for _, state, _ in fetched]
        assert self.objective is not None  # the library's own step (ps)
        return self.objective.results(self.objective.merge(states))

    def stopping(self, handle) -> bool:
        """Under multiworker: whether any replica asked to stop before this chunk ran
        (every replica gets the same answer, from the chunk's all-reduce)."""
        return float(handle[2]) > 0

    def sync(self) -> None:
        """Wait until every scheduled step has run (under ps); a no-op otherwise."""
        if self.coordinator is not None:
            self.coordinator.join()


def _all_replicas_sum(value):
    # A tensor of this replica's own (identity): the argument itself, the same object on
    # every local replica, has no device for MultiWorkerMirroredStrategy to reduce to.
    return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM,
                                                          tf.identity(value))


__all__ = ["InputContext", "Replica", "make_optimizer", "steps_per_execution"]

