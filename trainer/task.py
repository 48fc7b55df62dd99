"""`python -m trainer.task`: flags -> ClusterInfo -> role -> run.

Flags and the cluster are parsed and checked before TensorFlow is imported, so a usage
mistake ends with one `error: ...` line and status 2 before any server starts. Then the
replica takes its role:

- evaluator: follows the job's checkpoints (trainer.evaluator);
- ps, and worker under the ps strategy: serves until stopped (trainer.servers);
- chief, and every worker under multiworker, or a single node: trains (trainer.train).

Where the outputs go is resolved here once (`resolve_outputs`): under `--job-dir`, except
that Vertex AI's AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR, when set,
take the export, the checkpoints and the summaries (docs/trainer.md).

This is the one place that turns typed errors into messages and exit statuses
(mljob/errors.py): 0 ok, 1 failed, 2 usage, 143 stopped after saving, 200 a peer is gone.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import os
import sys
import traceback

from mljob import cluster as cluster_lib
from mljob import storage
from mljob.contracts import AIP_CHECKPOINT_DIR, AIP_MODEL_DIR, AIP_TENSORBOARD_LOG_DIR
from mljob.errors import too_many_digits
from trainer.errors import EXIT_FAILED, EXIT_USAGE, TrainerError, UsageError

MODELS = ("cnn", "mlp")  # trainer.model.MODELS, repeated to keep TensorFlow unimported
PRECISIONS = ("off", "mixed_bfloat16")  # trainer.model.PRECISIONS, likewise
DEFAULT_JOBS_DIR = "jobs"
# Vertex AI sets AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR to
# <baseOutputDirectory>/model/, /checkpoints/ and /logs/; each replaces its folder under
# the job dir.


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def error(self, message):
        raise UsageError(f"{message}; see --help")


# What TensorFlow can hold, checked while the flags are parsed (before anything is
# written): steps and seeds are int64 in TensorFlow, a batch's size and the steps of one
# call are int32 in its shapes and loop counters, and the optimizer's rate is a float32.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.401298464324817e-45  # the smallest positive float32 (denormal)


def _int_type(low: int, high: int):
    """An argparse type: an integer in [low, high], else a message naming the range."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as exc:
            reason = too_many_digits(exc) or "not an integer"
            raise argparse.ArgumentTypeError(f"{text[:20]!r} is {reason}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is less than {low}")
        if value > high:
            raise argparse.ArgumentTypeError(
                f"{value} is more than {high}, the most TensorFlow can hold here")
        return value
    return parse


_positive = _int_type(1, INT64_MAX)
_non_negative = _int_type(0, INT64_MAX)
_int32_positive = _int_type(1, INT32_MAX)


def _float_where(check, wanted: str):
    """An argparse type: a float for which check(value) holds, else '<value> is not <wanted>'."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a number") from None
        if not check(value):
            raise argparse.ArgumentTypeError(f"{value} is not {wanted}")
        return value
    return parse


_learning_rate = _float_where(lambda v: FLOAT32_TINY <= v <= FLOAT32_MAX,
                              "a positive finite number a float32 can hold")
_fraction = _float_where(lambda v: 0.0 <= v < 1.0, "in [0, 1)")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m trainer.task", allow_abbrev=False,
                description="Train a Fashion-MNIST model as one replica of an mljob job.")
    add = p.add_argument
    add("--job-dir", help="where checkpoints, summaries and the export go (any fsspec "
        "URL); default jobs/trainer-<UTC time> in the working directory")
    add("--model", choices=MODELS, default="cnn", help="cnn (default) or mlp")
    add("--train-steps", type=_positive, default=2000)
    add("--batch-size", type=_int32_positive, default=100,
        help="examples a step (split over the replicas under multiworker)")
    add("--learning-rate", type=_learning_rate, default=1e-3, help="Adam's step size")
    add("--eval-every", type=_non_negative, default=1000,
        help="evaluate every N steps on the chief (0: only at the end)")
    add("--checkpoint-every", type=_non_negative, default=500,
        help="checkpoint every N steps (0: only at the end)")
    add("--keep-checkpoints", type=_int32_positive, default=5)
    add("--steps-per-execution", type=_int32_positive, default=None,
        help="steps run by one tf.function call / scheduled function (default: "
        "trainer.train.STEPS_PER_EXECUTION)")
    add("--ps-shards", type=_int_type(0, INT32_MAX), default=0,
        help="shards per variable over the ps: 0 automatic, 1 none, N fixed")
    add("--strategy", choices=cluster_lib.STRATEGIES, default="auto")
    add("--data-dir", help="folder with the four IDX files or mnist.npz")
    add("--train-files", help="comma-separated training files (IDX pair or .npz)")
    add("--eval-files", help="comma-separated test files (IDX pair or .npz)")
    add("--log-every", type=_positive, default=100)
    add("--seed", type=_non_negative, default=None,
        help="seed for the initial weights and the shuffling")
    add("--dropout", type=_fraction, default=0.4, help="dropout rate of the CNN")
    add("--mixed-precision", choices=PRECISIONS, default="off",
        help="off (default) or mixed_bfloat16: compute in bfloat16, keep float32 "
        "variables, checkpoints and export (faster CNN on CPUs with AMX/AVX512-BF16)")
    seeds = p.add_argument_group("cluster flags of the original samples (instead of "
                                 "TF_CONFIG; worker 0 is the chief)")
    seeds.add_argument("--ps-hosts")
    seeds.add_argument("--worker-hosts")
    seeds.add_argument("--job-name")
    seeds.add_argument("--task-index", type=_non_negative)
    return p


@dataclasses.dataclass(frozen=True)
class Outputs:
    """Where this job's outputs go, resolved once from --job-dir and the environment."""

    job_dir: str
    export_url: str        # the SavedModel: AIP_MODEL_DIR or <job-dir>/model
    checkpoint_url: str    # AIP_CHECKPOINT_DIR or <job-dir>/checkpoints
    summary_url: str       # AIP_TENSORBOARD_LOG_DIR or <job-dir>/summaries (train/, eval/)
    from_environment: tuple[str, ...] = ()  # the AIP_* variables in effect

    def describe(self) -> str:
        return (f"outputs: model={self.export_url} checkpoints={self.checkpoint_url} "
                f"summaries={self.summary_url} (from {', '.join(self.from_environment)})")


def resolve_outputs(job_dir: str | None, environ) -> Outputs:
    """--job-dir and the AIP_* variables, checked; a bad URL is a UsageError naming it.

    Without --job-dir the job dir is the parent of AIP_MODEL_DIR when that is set (where
    Vertex AI's base output directory is), else jobs/trainer-<UTC time>."""
    aip = {}
    for name in (AIP_MODEL_DIR, AIP_CHECKPOINT_DIR, AIP_TENSORBOARD_LOG_DIR):
        value = (environ.get(name) or "").strip()
        if value:
            aip[name] = _checked_url(_without_slash(value), name)
    if job_dir is None and AIP_MODEL_DIR in aip:
        job_dir = _parent(aip[AIP_MODEL_DIR])
    elif job_dir is None:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d_%H%M%S")
        job_dir = os.path.join(DEFAULT_JOBS_DIR, f"trainer-{stamp}")
    _checked_url(job_dir, "--job-dir")
    return Outputs(
        job_dir=job_dir,
        export_url=aip.get(AIP_MODEL_DIR) or storage.join(job_dir, "model"),
        checkpoint_url=aip.get(AIP_CHECKPOINT_DIR) or storage.join(job_dir, "checkpoints"),
        summary_url=aip.get(AIP_TENSORBOARD_LOG_DIR) or storage.join(job_dir, "summaries"),
        from_environment=tuple(aip))


def _checked_url(url: str, name: str) -> str:
    try:
        storage.filesystem(url)
    except storage.StorageError as exc:
        raise UsageError(f"{name}: {exc}") from None
    return url


def _without_slash(url: str) -> str:
    """Vertex AI's values end in '/'; joins and the job record want none."""
    stripped = url.rstrip("/")
    return stripped if stripped and not stripped.endswith(":") else url


def _parent(url: str) -> str:
    scheme, sep, path = url.rpartition("://")
    head = path.rpartition("/")[0]
    if not head:
        raise UsageError(f"{AIP_MODEL_DIR} {url!r} has no parent folder to use as the job "
                         "dir; give --job-dir")
    return f"{scheme}{sep}{head}"


def config_from(args: argparse.Namespace, outputs: Outputs):
    """The validated TrainConfig (imports TensorFlow via trainer.train)."""
    from trainer.train import STEPS_PER_EXECUTION, TrainConfig
    return TrainConfig(
        job_dir=outputs.job_dir, export_url=outputs.export_url,
        checkpoint_url=outputs.checkpoint_url, summary_url=outputs.summary_url,
        model=args.model, train_steps=args.train_steps,
        batch_size=args.batch_size, learning_rate=args.learning_rate,
        eval_every=args.eval_every, checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        steps_per_execution=args.steps_per_execution or STEPS_PER_EXECUTION,
        ps_shards=args.ps_shards,
        strategy=args.strategy, data_dir=args.data_dir, train_files=args.train_files,
        eval_files=args.eval_files, log_every=args.log_every, seed=args.seed,
        dropout=args.dropout, mixed_precision=args.mixed_precision)


def _check(args: argparse.Namespace, info: cluster_lib.ClusterInfo) -> str | None:
    """Checks that need no TensorFlow; returns the strategy kind when it is known now."""
    for flag in ("--data-dir", "--train-files", "--eval-files"):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None and not value.strip(" ,"):
            raise UsageError(f"{flag} is empty; name the data, or leave {flag} out for the "
                             "default data")
    if args.data_dir and (args.train_files or args.eval_files):
        raise UsageError("give either --data-dir or --train-files/--eval-files, not both")
    if bool(args.train_files) != bool(args.eval_files):
        missing = "--eval-files" if args.train_files else "--train-files"
        raise UsageError(f"--train-files and --eval-files go together; add {missing}")
    if info.is_single_node:
        return None  # mirrored or single depends on the GPUs TensorFlow sees
    return info.strategy_kind(args.strategy, num_gpus=0)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
        info = cluster_lib.from_environment(
            os.environ, ps_hosts=args.ps_hosts, worker_hosts=args.worker_hosts,
            job_name=args.job_name, task_index=args.task_index)
        outputs = resolve_outputs(args.job_dir, os.environ)
        kind = _check(args, info)
        if info.is_chief and args.job_dir is None:
            whence = f" (the parent of {AIP_MODEL_DIR})" if AIP_MODEL_DIR in \
                outputs.from_environment else ""
            print(f"no --job-dir given; writing to {outputs.job_dir}{whence}", flush=True)
        if info.is_chief and outputs.from_environment:
            print(outputs.describe(), flush=True)
        if info.is_chief and info.source == "CLUSTER_SPEC":
            print(f"cluster: {info.describe()} from CLUSTER_SPEC (Vertex AI worker pools)",
                  flush=True)
        return _run_role(args, info, kind, outputs)
    except TrainerError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_status
    except cluster_lib.ClusterConfigError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except storage.StorageError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr, flush=True)
        return 130


def _run_role(args, info: cluster_lib.ClusterInfo, kind: str | None,
              outputs: Outputs) -> int:
    if importlib.util.find_spec("tensorflow") is None:  # it is an extra, not a requirement
        raise TrainerError("TensorFlow is not installed for this Python; install mljob with "
                           "its cpu or gpu extra (pip install -e '.[cpu]'), or run in an "
                           "image that has TensorFlow")
    # A dead worker goes unnoticed unless gRPC fails fast; read when TF loads gRPC.
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    from trainer import servers
    stop = servers.StopSignal()
    if info.is_evaluator:
        stop.install()
        from trainer import evaluator
        return evaluator.run(config_from(args, outputs), stop)
    if kind == "ps" and info.task_type in (cluster_lib.PS, cluster_lib.WORKER):
        return servers.serve(info, stop)
    import tensorflow as tf
    if kind is None:
        kind = info.strategy_kind(args.strategy,
                                  num_gpus=len(tf.config.list_physical_devices("GPU")))
    # Until the strategy starts (train.run takes the signals over then), SIGTERM
    # ends a replica at once: there is nothing to save yet.
    from trainer import train
    try:
        return train.run(info, config_from(args, outputs), kind, stop)
    except TrainerError:
        raise
    except Exception:  # a bug: keep the traceback, it is what a report needs
        traceback.print_exc()
        print("error: training failed with an unexpected error (traceback above)",
              file=sys.stderr, flush=True)
        return EXIT_FAILED


def _exit(status: int) -> None:
    """End the process now: gRPC and coordinator threads of a distributed run can keep
    the interpreter from exiting after main() returns."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    _exit(main())


__all__ = ["main", "parser", "config_from", "resolve_outputs", "Outputs"]
