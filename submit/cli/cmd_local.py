"""`local train|predict`, as `gcloud ai-platform local`: the working tree's trainer run
on this machine without staging, and predictions from an export."""
from __future__ import annotations

import os
import time

import click

from submit import lifecycle, submission
from submit.packaging import package
from submit.jobdef import spec as specs
from submit.cli.cli_base import GcloudGroup, TrainerArgsCommand, cli, echo
from submit.errors import UsageError
from submit.runners import local
from submit.runners.engine import EngineOptions


@cli.group("local", cls=GcloudGroup)
def local_group():
    """Run the trainer from the working tree, as `gcloud ai-platform local train`."""


@local_group.command("train", cls=TrainerArgsCommand)
@click.option("--package-path", type=click.Path(file_okay=False),
              help="Folder the module is imported from (default: this project's tree).")
@click.option("--module-name", default="trainer.task", show_default=True)
@click.option("--job-dir", help="Job output URL, appended to the trainer's args.")
@click.option("--distributed", is_flag=True, help="Run a chief, workers and ps.")
@click.option("--worker-count", type=int, help="Workers with --distributed (default 2).")
@click.option("--parameter-server-count", type=int,
              help="Parameter servers with --distributed (default 2).")
@click.option("--evaluator-count", type=int, help="Evaluators with --distributed.")
@click.option("--start-port", type=click.IntRange(1, 65535),
              help="First port; chief, workers and ps get consecutive ones (default: free "
                   "ports).")
@click.pass_context
def local_train(ctx, package_path, module_name, job_dir, distributed, worker_count,
                parameter_server_count, evaluator_count, start_port):
    """Run MODULE from the working tree: one process, or a local cluster with
    --distributed. Trainer args follow `--`."""
    counts = {"workerCount": worker_count, "parameterServerCount": parameter_server_count,
              "evaluatorCount": evaluator_count}
    if not distributed and any(v is not None for v in counts.values()):
        raise UsageError("--worker-count, --parameter-server-count and --evaluator-count "
                         "need --distributed")
    flags = {}  # as flags, so that a mistake names the flag
    if distributed:
        flags = dict(worker_count=2 if worker_count is None else worker_count,
                     parameter_server_count=(2 if parameter_server_count is None
                                             else parameter_server_count),
                     evaluator_count=evaluator_count or 0)
    job_id = "local_" + time.strftime("%Y%m%d_%H%M%S") + f"_{os.getpid()}"
    spec = specs.resolve(specs.Flags(
        job_id, scale_tier="CUSTOM", master_machine_type="standard", job_dir=job_dir,
        module_name=module_name, args=tuple(ctx.meta["trainer_args"] or ()), staged=False,
        **flags))
    source = package.check_package_path(package_path)
    n = sum(spec.count(t) for t in (specs.CHIEF, specs.WORKER, specs.PS))
    if start_port is not None and start_port + n - 1 > 65535:
        raise UsageError(f"--start-port {start_port} leaves too few ports for {n} replicas")
    ports = list(range(start_port, start_port + n)) if start_port else None
    runner = local.LocalEngine(EngineOptions(), ports=ports, source_dir=source)
    rendered = runner.render(spec, None)
    return submission.start(runner, rendered,
                            lifecycle.new_record(runner, spec, None, rendered), echo,
                            stream=True)




@local_group.command("predict", context_settings={"ignore_unknown_options": True,
                                                  "allow_extra_args": True,
                                                  "help_option_names": []})
@click.pass_context
def local_predict(ctx):
    """Predict from an export, as `gcloud ai-platform local predict`: --model-dir DIR
    and one of --json-instances, --json-request, --text-instances FILE (`python -m
    predict local --help` lists them). Loaded only when asked for: TensorFlow's
    settings stay out of every other command's environment."""
    from predict import __main__ as predict_cli
    return predict_cli.local.main(without_framework(list(ctx.args)),
                                  prog_name="python -m submit local predict",
                                  standalone_mode=False)


def without_framework(args: list[str]) -> list[str]:
    """gcloud's `--framework tensorflow` taken (the others refused: the export is a
    SavedModel), and left out of what `predict local` reads."""
    from submit.jobdef import version_config
    out: list[str] = []
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name == "--framework":
            if not eq:
                if i + 1 >= len(args):
                    raise UsageError("--framework needs a value, e.g. --framework "
                                     "tensorflow")
                value, i = args[i + 1], i + 1
            version_config.framework(value)
        elif args[i] == "--":
            return out + args[i:]
        else:
            out.append(args[i])
        i += 1
    return out
