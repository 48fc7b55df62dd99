"""`python -m trainer.task`: flags -> ClusterInfo -> `mljob.training.fit`.

Flags and the cluster are parsed and checked before TensorFlow is imported, so a usage
mistake ends with one `error: ...` line and status 2 before any server starts. Then the
replica takes its role in `mljob.training` (trainer.fit gives it the model and data):

- evaluator: follows the job's checkpoints;
- ps, and worker under the ps strategy: serves until stopped;
- chief, and every worker under multiworker, or a single node: trains.

Where the outputs go is resolved here once (`resolve_outputs`, mljob.training.outputs):
under `--job-dir`, except that Vertex AI's AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and
AIP_TENSORBOARD_LOG_DIR, when set, take the export, the checkpoints and the summaries
(docs/trainer.md).

This is the one place that turns typed errors into messages and exit statuses
(mljob/errors.py): 0 ok, 1 failed, 2 usage, 143 stopped after saving, 200 a peer is gone.
"""
from __future__ import annotations

import argparse
import os
import sys

from mljob import cluster as cluster_lib
from mljob import startup
from mljob.contracts import AIP_MODEL_DIR
from mljob.errors import boundary, too_many_digits
from mljob.training.config import MERGE_RULES, STEPS_PER_EXECUTION, WIRE_DTYPES, \
    RunConfig
from mljob.training.outputs import DEFAULT_JOBS_DIR, Outputs, resolve_outputs
from trainer.errors import UsageError

MODELS = ("cnn", "mlp")  # trainer.model.MODELS, repeated to keep TensorFlow unimported
PRECISIONS = ("auto", "off", "mixed_bfloat16")  # mljob.training.precision.PRECISIONS
SCHEDULES = ("constant", "cosine")  # trainer.fit.SCHEDULES


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting, and takes
    `--learning_rate` for `--learning-rate`: tuning services pass each parameter as
    `--<parameterName>=<value>` and the samples' own flags were underscored. Only the
    dashed form is declared, so --help shows it alone and an unknown name stays an
    error in the user's spelling."""

    def error(self, message):
        raise UsageError(f"{message}; see --help")

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(self._dashed(args), namespace)

    def _dashed(self, args: list[str]) -> list[str]:
        out: list[str] = []
        for i, arg in enumerate(args):
            if arg == "--":
                return out + args[i:]
            name, eq, value = arg.partition("=")
            dashed = "--" + name[2:].replace("_", "-")
            if name.startswith("--") and dashed != name \
                    and dashed in self._option_string_actions:
                arg = dashed + eq + value
            out.append(arg)
        return out


# What TensorFlow can hold, checked while the flags are parsed (before anything is
# written): steps and seeds are int64 in TensorFlow, a batch's size and the steps of one
# call are int32 in its shapes and loop counters, and the optimizer's rate is a float32.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.401298464324817e-45  # the smallest positive float32 (denormal)


def _whole_float(text: str) -> int | None:
    """`64.0` as 64 (a tuning service's DISCRETE value); None for anything else."""
    try:
        number = float(text)
    except ValueError:
        return None
    return int(number) if number.is_integer() else None


def _int_type(low: int, high: int):
    """An argparse type: an integer in [low, high], else a message naming the range."""
    def parse(text: str) -> int:
        value: int | None
        try:
            value = int(text)
        except ValueError as exc:
            reason = too_many_digits(exc)
            if reason is None:  # Vertex AI passes a tuned DISCRETE value as a double
                value = _whole_float(text)
            if reason is not None or value is None:
                raise argparse.ArgumentTypeError(
                    f"{text[:20]!r} is {reason or 'not an integer'}") from None
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
                description="Train a Fashion-MNIST model as one replica of an mljob job. "
                "Every flag is also accepted with underscores for its dashes (a tuning job "
                "passes each parameter as --<parameterName>=<value>).")

    add = p.add_argument
    add("--job-dir", help="where checkpoints, summaries and the export go (any fsspec "
        "URL); default jobs/trainer-<UTC time> in the working directory")
    add("--model", choices=MODELS, default="cnn", help="cnn (default) or mlp")
    add("--train-steps", type=_positive, default=2000)
    add("--batch-size", type=_int32_positive, default=100,
        help="examples a step (split over the replicas under multiworker)")
    add("--learning-rate", type=_learning_rate, default=None,
        help="Adam's step size, the peak of --lr-schedule (default 0.002 for the CNN, "
        "0.01 for the MLP)")
    add("--lr-schedule", choices=SCHEDULES, default=None,
        help="the step size over the run: cosine (the default: from --learning-rate "
        "down to 0 at --train-steps along half a cosine, keyed on the optimizer's step "
        "count, so a resumed job goes on where it stopped) or constant")
    add("--eval-every", type=_non_negative, default=1000,
        help="evaluate every N steps on the chief (0: only at the end)")
    add("--checkpoint-every", type=_non_negative, default=500,
        help="checkpoint every N steps (0: only at the end)")
    add("--keep-checkpoints", type=_int32_positive, default=5)
    add("--steps-per-execution", type=_int32_positive, default=None,
        help="steps run by one tf.function call / scheduled function (default: "
        "mljob.training.STEPS_PER_EXECUTION)")
    add("--ps-shards", type=_int_type(0, INT32_MAX), default=0,
        help="shards per variable over the ps: 0 automatic, 1 none, N fixed")
    add("--ps-local-steps", action=argparse.BooleanOptionalAction, default=True,
        help="under ps (default on): each scheduled function trains a local copy of the "
        "weights and Adam's state and adds its change to the ps (the weights' summed "
        "over sqrt(workers), the moments' averaged; one read and one write per "
        "function); --no-ps-local-steps: step by step")
    add("--ps-wire-dtype", choices=WIRE_DTYPES, default=None,
        help="under ps with local steps: bfloat16 (the default) halves the bytes of each "
        "read of the weights and write of their change; float32 sends them whole")
    add("--ps-merge", choices=MERGE_RULES, default=None,
        help="under ps with local steps, what the ps adds of N workers' weight changes: "
        "sqrt (the default) their sum over sqrt(N), or mean (the rule before); Adam's "
        "moments always take the mean")
    add("--strategy", choices=cluster_lib.STRATEGIES, default="auto")
    add("--data-dir", help="folder with the four IDX files or mnist.npz")
    add("--train-files", help="comma-separated training files (IDX pair or .npz)")
    add("--eval-files", help="comma-separated test files (IDX pair or .npz)")
    add("--log-every", type=_positive, default=100)
    add("--seed", type=_non_negative, default=None,
        help="seed for the initial weights and the shuffling")
    add("--dropout", type=_fraction, default=None,
        help="dropout rate before the logits (default 0.4 for the CNN, 0 for the MLP)")
    add("--hidden-units", type=_positive, default=None,
        help="width of the fully connected hidden layer (default 1024 for the CNN, "
        "100 for the MLP)")
    add("--mixed-precision", choices=PRECISIONS, default="auto",
        help="auto (default): bfloat16 compute where the CPU has AVX512_BF16 or AMX (or "
        "the GPUs have compute capability 8.0+), float32 elsewhere; mixed_bfloat16: "
        "bfloat16 compute; off: float32. Variables, checkpoints and the export stay "
        "float32 either way")
    seeds = p.add_argument_group("cluster flags of the original samples (instead of "
                                 "TF_CONFIG; worker 0 is the chief)")
    seeds.add_argument("--ps-hosts")
    seeds.add_argument("--worker-hosts")
    seeds.add_argument("--job-name")
    seeds.add_argument("--task-index", type=_non_negative)
    return p


def config_from(args: argparse.Namespace, outputs: Outputs) -> RunConfig:
    """The library's RunConfig from the flags (the model's own flags go to trainer.fit)."""
    return RunConfig(
        job_dir=outputs.job_dir, export_url=outputs.export_url,
        checkpoint_url=outputs.checkpoint_url, summary_url=outputs.summary_url,
        train_steps=args.train_steps, batch_size=args.batch_size,
        eval_every=args.eval_every, checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        steps_per_execution=args.steps_per_execution or STEPS_PER_EXECUTION,
        ps_shards=args.ps_shards,
        ps_local_steps=args.ps_local_steps, ps_wire_dtype=args.ps_wire_dtype,
        ps_merge=args.ps_merge,
        strategy=args.strategy,
        log_every=args.log_every, seed=args.seed)


# Adam's step size (the schedule's peak) and its schedule by model when --learning-rate
# and --lr-schedule are not given. The MLP's cosine from 0.01 down to 0 at --train-steps
# reaches 87% test accuracy at step 1,500-1,750 of its default job (seeds 1 to 3), where
# the constant 0.003 it had took about 3,000 steps (0.001 before it 5,000-5,500), and
# ends 1.1-2.3 points higher (bench/results/time_to_accuracy_sweep_mlp_lr.json). The
# CNN's cosine from 0.002 down to 0 at --train-steps reaches 91% at step 1,300 of its
# default job (seeds 1 and 2), where the constant 0.001 it had never did in 2,000
# steps, and ends 0.8-1.2 points higher (bench/README.md, section 10;
# bench/results/time_to_accuracy_sweep_*_cnn_lr.json).
LEARNING_RATES = {"cnn": 2e-3, "mlp": 1e-2}
LR_SCHEDULES = {"cnn": "cosine", "mlp": "cosine"}


def learning_rate_of(args: argparse.Namespace) -> float:
    """--learning-rate, else the model's default (LEARNING_RATES)."""
    if args.learning_rate is not None:
        return args.learning_rate
    return LEARNING_RATES[args.model]


def lr_schedule_of(args: argparse.Namespace) -> str:
    """--lr-schedule, else the model's default (LR_SCHEDULES)."""
    return args.lr_schedule or LR_SCHEDULES[args.model]


def dropout_of(args: argparse.Namespace) -> float:
    """--dropout, else the original samples' models': 0.4 in the CNN, none in the MLP."""
    if args.dropout is not None:
        return args.dropout
    return 0.4 if args.model == "cnn" else 0.0


def _check(args: argparse.Namespace, info: cluster_lib.ClusterInfo) -> str | None:
    """Checks that need no TensorFlow (a --strategy the cluster cannot run among them);
    returns the strategy kind when it is known now."""
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
    if args.ps_wire_dtype == "bfloat16" and not args.ps_local_steps:
        raise UsageError(f"--ps-wire-dtype {args.ps_wire_dtype} packs what local steps "
                         "send; leave out --no-ps-local-steps, or --ps-wire-dtype")
    if args.ps_merge is not None and not args.ps_local_steps:
        raise UsageError(f"--ps-merge {args.ps_merge} merges what local steps send; leave "
                         "out --no-ps-local-steps, or --ps-merge")
    if info.is_single_node:
        return None  # mirrored or single depends on the GPUs TensorFlow sees
    return info.strategy_kind(args.strategy, num_gpus=0)


def main(argv: list[str] | None = None) -> int:
    """The bundled trainer's command line; its exit status (`mljob.errors.boundary`: a
    one-line `error: ...` for typed errors, a traceback only for a bug)."""
    startup.mark("main")
    return boundary(lambda: _main(argv), program="training")


def _main(argv: list[str] | None) -> int:
    args = parser().parse_args(argv)
    info = cluster_lib.from_environment(
        os.environ, ps_hosts=args.ps_hosts, worker_hosts=args.worker_hosts,
        job_name=args.job_name, task_index=args.task_index)
    outputs = resolve_outputs(args.job_dir, os.environ)
    _check(args, info)
    if info.is_chief and args.job_dir is None:
        whence = f" (the parent of {AIP_MODEL_DIR})" if AIP_MODEL_DIR in \
            outputs.from_environment else ""
        print(f"no --job-dir given; writing to {outputs.job_dir}{whence}", flush=True)
    if info.is_chief and outputs.from_environment:
        print(outputs.describe(), flush=True)
    if info.is_chief and info.source == "CLUSTER_SPEC":
        print(f"cluster: {info.describe()} from CLUSTER_SPEC (Vertex AI worker pools)",
              flush=True)
    return _run_role(args, info, outputs)


def _run_role(args, info: cluster_lib.ClusterInfo, outputs: Outputs) -> int:
    config = config_from(args, outputs)
    from mljob import training  # no TensorFlow yet; sets GRPC_FAIL_FAST before it loads
    training.require_tensorflow()
    served = training.serve_if_server(info, config)  # a ps: no Keras, no model, no data
    if served is not None:
        return served
    with startup.lean_imports():
        from trainer import fit
    startup.mark("tensorflow")
    return fit.run(args, config, info, dropout=dropout_of(args),
                   learning_rate=learning_rate_of(args),
                   lr_schedule=lr_schedule_of(args))


def _exit(status: int) -> None:
    """End the process now: gRPC and coordinator threads of a distributed run can keep
    the interpreter from exiting after main() returns."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    _exit(main())


__all__ = ["main", "parser", "learning_rate_of", "lr_schedule_of", "config_from",
           "resolve_outputs", "Outputs", "DEFAULT_JOBS_DIR"]
