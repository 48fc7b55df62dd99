"""python -m submit: gcloud ai-platform's commands for mljob's jobs, models and versions.

    python -m submit JOB_ID [options] [-- trainer args]         submit (and by default stream)
    python -m submit jobs submit training JOB_ID [options]      the same, as gcloud writes it
    python -m submit jobs list|describe|stream-logs|cancel|update  manage submitted jobs
    python -m submit local train [--distributed ...] [-- args]  run the working tree
    python -m submit local predict --model-dir DIR --json-instances FILE
    python -m submit local-run --executor-image-uri IMAGE --python-module M [-- args]

The commands live in `submit.cli.cmd_*` modules, each adding itself to the root group of
`submit.cli.cli_base`; this module registers them and runs them inside the one error
boundary of every mljob program (`mljob.errors.boundary`): library errors (`submit.errors`,
storage, predict and click errors) become a one-line `error: ...` on stderr and an exit
status (2 for usage).
"""
from __future__ import annotations

import json
import logging
import sys

from mljob.errors import boundary, needs_extra, say

try:
    import click

    from submit.cli import (cmd_console, cmd_jobs, cmd_local, cmd_local_run,  # noqa: F401
                            cmd_models, cmd_prediction, cmd_predict, cmd_submit)
    from submit import jobs as records, lifecycle
    from submit.cli.cli_base import cli, echo
    from submit.errors import EXIT_OK, EXIT_USAGE
    from submit.local import entry, plan as plans
except ModuleNotFoundError as exc:  # installed without the `submit` extra
    needs_extra(exc, "python -m submit", "submit")

_NoArgsIsHelp = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2

# `jobs submit KIND`: one line each
cmd_jobs.jobs_submit.add_command(cmd_submit.training_command)
cmd_jobs.jobs_submit.add_command(cmd_prediction.prediction_command)


def _supervise_job(plan_file: str) -> int:
    with open(plan_file) as f:
        plan = plans.JobPlan.from_dict(json.load(f))
    record = records.load(plan.job_id)
    entry.run(plan, record, stream=False)
    return lifecycle.report(record, echo)


def _supervise_ray_tuning(body_file: str) -> int:
    from submit.runners import ray_tuning  # Ray's and Optuna's, only here
    with open(body_file) as f:
        body = json.load(f)
    record = records.load(body["plan"]["job_id"])
    ray_tuning.run(body, record, stream=False)
    return lifecycle.report(record, echo)


def _supervise_prediction(plan_file: str) -> int:
    from submit.prediction.job import PredictionPlan, run
    with open(plan_file, "rb") as f:
        plan = PredictionPlan.from_json(f.read())
    record = records.load(plan.job_id)
    run(plan, record, stream=False)
    return lifecycle.report(record, echo)


# what a detached supervisor (`submit.local.entry.detach`) runs, by the job's kind
SUPERVISED = {"job": _supervise_job, "ray-tuning": _supervise_ray_tuning,
              "prediction": _supervise_prediction}


@cli.command("_supervise", hidden=True)
@click.argument("kind", type=click.Choice(tuple(SUPERVISED)))
@click.argument("body_file", type=click.Path(exists=True, dir_okay=False))
def supervise_command(kind, body_file):
    """Run a submitted job of KIND to its end, supervised here (started detached by
    --async): a training or tuning job, a tuning job on Ray, a batch prediction job."""
    return SUPERVISED[kind](body_file)


def main(argv=None, standalone_mode: bool = True):
    """Console entry point; returns the exit status when standalone_mode is False."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="warning: %(message)s")
    status = _main(argv)
    if standalone_mode:
        sys.exit(status)
    return status


def _main(argv) -> int:
    return boundary(lambda: _cli(argv), program="python -m submit")


def _cli(argv) -> int:
    """click's own outcomes as statuses; everything else is the boundary's."""
    try:
        result = cli.main(args=argv, prog_name="python -m submit", standalone_mode=False)
        return result if isinstance(result, int) else EXIT_OK
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except _NoArgsIsHelp as exc:  # a bare group: show its help, as click would
        click.echo(exc.ctx.get_help(), err=True)
        return EXIT_USAGE
    except click.NoSuchOption as exc:  # Vertex's local-run flags: said where they go
        say(cmd_local_run.elsewhere(exc.option_name)
            or f"{exc.format_message()} (see python -m submit --help)")
        return EXIT_USAGE
    except click.ClickException as exc:
        say(f"{exc.format_message()} (see python -m submit --help)")
        return EXIT_USAGE
    except click.exceptions.Abort:  # click's form of Ctrl-C
        raise KeyboardInterrupt from None


if __name__ == "__main__":
    main()
