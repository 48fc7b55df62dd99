"""`python -m trainer.task`: flags -> ClusterInfo -> role -> run.

Flags and the cluster are parsed and checked before TensorFlow is imported, so a usage
mistake ends with one `error: ...` line and status 2 before any server starts. Then the
replica takes its role:

- evaluator: follows the job's checkpoints (trainer.evaluator);
- ps, and worker under the ps strategy: serves until stopped (trainer.servers);
- chief, and every worker under multiworker, or a single node: trains (trainer.train).

This is the one place that turns typed errors into messages and exit statuses
(trainer/errors.py): 0 ok, 1 failed, 2 usage, 143 stopped after saving, 200 a peer is gone.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import traceback

from trainer import cluster as cluster_lib
from trainer import storage
from trainer.errors import EXIT_FAILED, EXIT_USAGE, TrainerError, UsageError

MODELS = ("cnn", "mlp")  # trainer.model.MODELS, repeated to keep TensorFlow unimported
PRECISIONS = ("off", "mixed_bfloat16")  # trainer.model.PRECISIONS, likewise
DEFAULT_JOBS_DIR = "jobs"


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def error(self, message):
        raise UsageError(f"{message}; see --help")


def _positive(text: str) -> int:
    return _int_at_least(text, 1)


def _non_negative(text: str) -> int:
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value} is less than {low}")
    return value


def _float_where(check, wanted: str):
    """An argparse type: a float for which check(value) holds, else '<value> is not <wanted>'."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not check(value):
            raise argparse.ArgumentTypeError(f"{value} is not {wanted}")
        return value
    return parse


_positive_float = _float_where(lambda v: v > 0, "positive")
_fraction = _float_where(lambda v: 0.0 <= v < 1.0, "in [0, 1)")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m trainer.task", allow_abbrev=False,
                description="Train a Fashion-MNIST model as one replica of an mljob job.")
    add = p.add_argument
    add("--job-dir", help="where checkpoints, summaries and the export go (any fsspec "
        "URL); default jobs/trainer-<UTC time> in the working directory")
    add("--model", choices=MODELS, default="cnn", help="cnn (default) or mlp")
    add("--train-steps", type=_positive, default=2000)
    add("--batch-size", type=_positive, default=100,
        help="examples a step (split over the replicas under multiworker)")
    add("--learning-rate", type=_positive_float, default=1e-3, help="Adam's step size")
    add("--eval-every", type=_non_negative, default=1000,
        help="evaluate every N steps on the chief (0: only at the end)")
    add("--checkpoint-every", type=_non_negative, default=500,
        help="checkpoint every N steps (0: only at the end)")
    add("--keep-checkpoints", type=_positive, default=5)
    add("--steps-per-execution", type=_positive, default=None,
        help="steps run by one tf.function call / scheduled function (default: "
        "trainer.train.STEPS_PER_EXECUTION)")
    add("--ps-shards", type=_non_negative, default=0,
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


def config_from(args: argparse.Namespace):
    """The validated TrainConfig (imports TensorFlow via trainer.train)."""
    from trainer.train import STEPS_PER_EXECUTION, TrainConfig
    return TrainConfig(
        job_dir=args.job_dir, model=args.model, train_steps=args.train_steps,
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
    if args.data_dir and (args.train_files or args.eval_files):
        raise UsageError("give either --data-dir or --train-files/--eval-files, not both")
    if bool(args.train_files) != bool(args.eval_files):
        missing = "--eval-files" if args.train_files else "--train-files"
        raise UsageError(f"--train-files and --eval-files go together; add {missing}")
    try:
        storage.filesystem(args.job_dir)
    except storage.StorageError as exc:
        raise UsageError(f"--job-dir: {exc}") from None
    if info.is_single_node:
        return None  # mirrored or single depends on the GPUs TensorFlow sees
    return info.strategy_kind(args.strategy, num_gpus=0)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
        info = cluster_lib.from_environment(
            os.environ, ps_hosts=args.ps_hosts, worker_hosts=args.worker_hosts,
            job_name=args.job_name, task_index=args.task_index)
        if args.job_dir is None:
            stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d_%H%M%S")
            args.job_dir = os.path.join(DEFAULT_JOBS_DIR, f"trainer-{stamp}")
            if info.is_chief:
                print(f"no --job-dir given; writing to {args.job_dir}", flush=True)
        kind = _check(args, info)
        return _run_role(args, info, kind)
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


def _run_role(args, info: cluster_lib.ClusterInfo, kind: str | None) -> int:
    # A dead worker goes unnoticed unless gRPC fails fast; read when TF loads gRPC.
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    from trainer import servers
    stop = servers.StopSignal()
    if info.is_evaluator:
        stop.install()
        from trainer import evaluator
        return evaluator.run(config_from(args), stop)
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
        return train.run(info, config_from(args), kind, stop)
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


__all__ = ["main", "parser", "config_from"]
