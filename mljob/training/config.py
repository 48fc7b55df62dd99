"""What a training run is given, as plain frozen values (no TensorFlow here).

- `RunConfig`: the loop's settings and where the outputs go (the bundled trainer's flags
  map onto it one to one, docs/trainer.md);
- `Serving`: the export's signature (the inputs a client sends, the outputs it gets, the
  instance key passed through);
- `Program`: the user's model, data, loss, optimizer and metrics, as functions the
  library calls in the right place (inside the strategy's scope, on the worker that
  reads the data);
- `Epochs`: Keras's `fit` arguments of the epoch mode (`training.fit(..., epochs=N)`).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mljob import cluster as cluster_lib
from mljob.training.errors import UsageError
from mljob.training.outputs import resolve_outputs

# Steps run by one tf.function call (one scheduled function under ps). 20 keeps the
# coordinator's ~10 ms per function under a third of a CPU step of the MLP at batch 100,
# while a log line still comes every few chunks. bench/ tunes it.
STEPS_PER_EXECUTION = 20
WIRE_DTYPES = ("float32", "bfloat16")  # RunConfig.ps_wire_dtype
# RunConfig.ps_merge: what the ps adds of N workers' weight changes under local steps:
# their sum over sqrt(N), or their mean; Adam's moments always take the mean.
MERGE_RULES = ("sqrt", "mean")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The loop's settings. The three output URLs, left empty, are resolved by
    `resolved()`: Vertex AI's AIP_* variables when set, else `<job-dir>/model`,
    `<job-dir>/checkpoints` and `<job-dir>/summaries`."""

    job_dir: str | None = None      # None: the parent of AIP_MODEL_DIR, or jobs/trainer-<time>
    export_url: str = ""            # the SavedModel
    checkpoint_url: str = ""
    summary_url: str = ""           # train/ and eval/ event files go in it
    train_steps: int = 2000
    batch_size: int = 100           # examples per step, split over synchronous replicas
    eval_every: int = 1000          # 0: evaluate only at the end
    checkpoint_every: int = 500     # 0: checkpoint only at the end (and when stopped)
    keep_checkpoints: int = 5
    steps_per_execution: int = STEPS_PER_EXECUTION
    ps_shards: int = 0              # 0: automatic, 1: no sharding, N: N shards
    # Under ps: a scheduled function's steps train the worker's copy of the weights and
    # Adam's state, then add the change to the ps (one read, one write per function).
    # None (default): on for Adam, off for other optimizers; True: on (Adam only).
    ps_local_steps: bool | None = None
    # Under ps with local steps: "bfloat16" halves the bytes of each read of the
    # weights and write of their change (the ps keeps float32 variables); None
    # (default): bfloat16 when local steps run.
    ps_wire_dtype: str | None = None
    # Under ps with local steps: MERGE_RULES; None (default): "sqrt".
    ps_merge: str | None = None
    strategy: str = "auto"          # mljob.cluster.STRATEGIES
    log_every: int = 100
    seed: int | None = None         # the input pipeline's shuffle seed (InputContext.seed)

    def check(self) -> None:
        """UsageError naming the first bad setting; run() calls it, so that
        `training.main` reports it in one line."""
        for name in ("train_steps", "batch_size", "keep_checkpoints",
                     "steps_per_execution", "log_every"):
            _at_least(name, getattr(self, name), 1)
        for name in ("eval_every", "checkpoint_every", "ps_shards"):
            _at_least(name, getattr(self, name), 0)
        if self.ps_wire_dtype is not None and self.ps_wire_dtype not in WIRE_DTYPES:
            raise UsageError(f"ps_wire_dtype {self.ps_wire_dtype!r} is not one of "
                             f"{', '.join(WIRE_DTYPES)}")
        if self.ps_merge is not None and self.ps_merge not in MERGE_RULES:
            raise UsageError(f"ps_merge {self.ps_merge!r} is not one of "
                             f"{', '.join(MERGE_RULES)}")
        if self.strategy not in cluster_lib.STRATEGIES:
            raise UsageError(f"strategy {self.strategy!r} is not one of "
                             f"{', '.join(cluster_lib.STRATEGIES)}")

    def resolved(self, environ: Mapping[str, str] = os.environ) -> "RunConfig":
        """This config, checked, with the job dir and every output URL filled in."""
        self.check()
        if self.job_dir and self.export_url and self.checkpoint_url and self.summary_url:
            return self
        out = resolve_outputs(self.job_dir, environ)
        return dataclasses.replace(
            self, job_dir=out.job_dir, export_url=self.export_url or out.export_url,
            checkpoint_url=self.checkpoint_url or out.checkpoint_url,
            summary_url=self.summary_url or out.summary_url)


def _at_least(name: str, value, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise UsageError(f"{name} must be an integer of at least {low}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Serving:
    """The export's `serving_default` signature.

    inputs: the model's inputs by name, each a `tf.TensorSpec` with a batch dimension
    (`tf.TensorSpec([None, 784], tf.float32)`); with one input the model is called with
    the tensor, with several with the dict. None (default): the model's own Input
    layers, each with its own dtype and shape (strings stay strings). outputs: model
    outputs -> a dict of named tensors (default `{"outputs": outputs}`). key: the name
    of an input passed through unchanged to an output of that name, so a client can
    match answers to instances
    (None: no key); key_dtype its dtype. keyless_signature: also export a signature of
    that name without the key. model_fn: the model the export is built from when it
    differs from the training one (e.g. float32 where training ran in bfloat16, or
    keras.io's FeatureSpace inference model around the trained one): the trained
    variables go into it by their paths, what only it holds keeps its own state.
    inference_signature: also export TF Serving's Classify or Regress signature,
    `{"classify": [label, ...]}` (one label per output column) or `{"regress": True}`;
    their scores are what `outputs` gives (probabilities, not logits).
    """

    inputs: Mapping[str, Any] | None = None
    outputs: Callable[[Any], Mapping[str, Any]] | None = None
    key: str | None = "key"
    key_dtype: str = "int64"
    keyless_signature: str | None = None
    model_fn: Callable[[], Any] | None = None
    inference_signature: Mapping[str, Any] | None = None

    def __post_init__(self):
        if self.inputs is not None and not self.inputs:
            raise UsageError("Serving needs at least one input, e.g. "
                             "inputs={'x': tf.TensorSpec([None, 4], tf.float32)}")
        if self.key is not None and self.key in (self.inputs or {}):
            raise UsageError(f"the instance key {self.key!r} is also a model input; name "
                             "the key differently (Serving(key=...)) or pass key=None")


@dataclasses.dataclass(frozen=True)
class Program:
    """The user's side of a run (see `mljob.training.fit` for each). loss, optimizer,
    metrics, loss_weights and weighted_metrics left None come from the model when
    model_fn() returns a compiled one."""

    model_fn: Callable[[], Any]
    train_dataset_fn: Callable[[Any], Any]
    loss: Any = None
    optimizer: Any = None
    metrics: Mapping[str, Any] | Sequence[Any] | None = None
    eval_dataset_fn: Callable[[], Any] | None = None
    serving: Serving | None = None
    describe: str | Callable[[], str] = ""
    loss_weights: Any = None
    weighted_metrics: Any = None
    class_weight: Mapping[int, float] | None = None

    def description(self) -> str:
        return self.describe() if callable(self.describe) else self.describe

    def objective(self, model):
        """The run's loss and metrics for this model (`losses.Objective`), not built."""
        from mljob.training.losses import Objective  # TensorFlow, when a run starts
        return Objective.of(model, loss=self.loss, metrics=self.metrics,
                            loss_weights=self.loss_weights,
                            weighted_metrics=self.weighted_metrics,
                            class_weight=self.class_weight)


@dataclasses.dataclass(frozen=True)
class Epochs:
    """`training.fit`'s epoch mode: Keras's `fit` arguments of the same names (see
    `mljob.fitting.library`). `steps_per_epoch` is required: `train_dataset_fn` gives an
    endless dataset, and the progress lines count `epochs * steps_per_epoch` steps."""

    epochs: int
    steps_per_epoch: int | None = None
    validation_steps: int | None = None
    validation_freq: int = 1
    callbacks: tuple = ()
    initial_epoch: int = 0

    @property
    def train_steps(self) -> int:
        return self.epochs * (self.steps_per_epoch or 0)

    def check(self, config: RunConfig, validation: bool) -> None:
        """UsageError, before TensorFlow loads, for a bad value or combination."""
        _at_least("epochs", self.epochs, 1)
        if self.steps_per_epoch is None:
            raise UsageError("epochs needs steps_per_epoch: train_dataset_fn gives an "
                             "endless dataset, so say how many of its batches make an "
                             "epoch (steps_per_epoch=N)")
        _at_least("steps_per_epoch", self.steps_per_epoch, 1)
        _at_least("validation_freq", self.validation_freq, 1)
        _at_least("initial_epoch", self.initial_epoch, 0)
        if self.initial_epoch >= self.epochs:
            raise UsageError(f"initial_epoch {self.initial_epoch} leaves no epoch to run "
                             f"of epochs={self.epochs}; give initial_epoch < epochs")
        if self.validation_steps is not None:
            _at_least("validation_steps", self.validation_steps, 1)
            if not validation:
                raise UsageError("validation_steps without validation_data: give "
                                 "validation_data (a dataset or a function returning "
                                 "one), or leave validation_steps out")
        for name in STEP_MODE:  # the step mode's settings, which epochs replace
            if getattr(config, name) != getattr(RunConfig, name):
                raise UsageError(
                    f"RunConfig.{name} is the step mode's, and epochs=... was given: "
                    "train by epochs (epochs, steps_per_epoch, validation_freq) or by "
                    "steps (RunConfig.train_steps, eval_every, ...), not both")
        for callback in self.callbacks:
            if not hasattr(callback, "set_model") or not hasattr(callback, "on_epoch_end"):
                raise UsageError(f"callbacks holds a {type(callback).__name__}, not a "
                                 "keras.callbacks.Callback")


# RunConfig's settings of the step mode, refused with epochs when changed from their
# defaults (in epoch mode a line, an evaluation and a checkpoint come each epoch).
STEP_MODE = ("train_steps", "eval_every", "checkpoint_every", "log_every")
# training.fit's arguments that belong to the epoch mode, with their defaults.
EPOCH_ARGUMENTS = {"steps_per_epoch": None, "validation_steps": None,
                   "validation_freq": 1, "callbacks": None, "initial_epoch": 0}


__all__ = ["RunConfig", "Serving", "Program", "Epochs", "STEPS_PER_EXECUTION",
           "WIRE_DTYPES", "EPOCH_ARGUMENTS"]
