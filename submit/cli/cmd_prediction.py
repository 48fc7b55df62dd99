"""`python -m submit jobs submit prediction JOB ...`: Cloud ML's batch prediction job.

Flags -> spec -> submission: the flags are checked into a `PredictionSpec`
(`submit.prediction.spec`) and handed to `submit.submission.submit_prediction`, which
renders the job on its runner (the local shard plan, a Vertex BatchPredictionJob, a
Kubernetes Indexed Job) and drives it through the one job life (`submit.lifecycle`): a
local job in the foreground, following its logs (Ctrl-C cancels it), or with `--async`
under a detached supervisor; an engine's job returns once created. Every mistake is one
line and exit status 2 before anything is recorded.

`submit.__main__` adds the command to `jobs submit`.
"""
from __future__ import annotations

import click

from submit import runners, submission
from submit.cli.cli_base import echo
from submit.cli.cmd_submit import RunnerParams, declared_params
from submit.prediction import spec as prediction_spec
from submit.runners.engine import EngineOptions


class PredictionCommand(RunnerParams, click.Command):
    """`jobs submit prediction`: its own flags, then the options the runners declare for
    a batch prediction job (`RunOpt.prediction`)."""

    def declared(self) -> list[click.Option]:
        return declared_params(prediction=True)


@click.command("prediction", cls=PredictionCommand)
@click.argument("job_id")
@click.option("--model-dir", metavar="URL", help="The export to predict with (a "
              "SavedModel or legacy export folder: <job-dir>/model). Any storage URL.")
@click.option("--model", help="A model name: $MLJOB_HOME/models/MODEL's versions (vertex: "
                              "the Model resource).")
@click.option("--version", help="The model's version [default: its highest].")
@click.option("--input-paths", metavar="URL_GLOB[,...]",
              help="Input files: a glob or comma-separated globs (any storage URL).")
@click.option("--output-path", metavar="URL",
              help="Folder for prediction.results-* and prediction.errors_stats-*.")
@click.option("--data-format", type=click.Choice(tuple(prediction_spec.DATA_FORMATS)),
              help="text: JSON instances a line; tf-record: TFRecords of JSON instances or "
                   "tf.train.Example; tf-record-gzip: the same, gzip-compressed.")
@click.option("--region", help="The region (required, as gcloud requires it).")
@click.option("--max-worker-count", type=int,
              help=f"Most workers [default: {prediction_spec.DEFAULT_WORKERS}, capped by "
                   "this machine's cores and memory on the local runner].")
@click.option("--batch-size", type=int, help="Instances a model call [default: 64].")
@click.option("--signature-name", help="The export's signature [default: serving_default].")
@click.option("--labels", multiple=True, metavar="KEY=VALUE,...", help="Labels for the job.")
@click.option("--runtime-version", help="Cloud ML's runtime version, recorded.")
@click.option("--async", "run_async", is_flag=True, help="Return at once; follow the job "
              "with `jobs stream-logs`.")
@click.option("--resume", is_flag=True, help="Continue this job after a cancel or a crash: "
              "the shards already published are skipped.")
@click.option("--runner", default="local", show_default=True,
              type=click.Choice(tuple(runners.RUNNERS)),
              help=f"Where the job runs: {', '.join(runners.PREDICTION)} (the others run "
                   "no batch prediction job).")
@click.option("--dry-run", is_flag=True, help="Print the job (the local plan, the Vertex "
              "BatchPredictionJob or the Kubernetes Job); run nothing.")
def prediction_command(job_id, run_async, resume, runner, dry_run, **flags):
    """Submit batch prediction job JOB_ID, as `gcloud ai-platform jobs submit prediction`."""
    declared = runners.declared_options(prediction=True)
    options = EngineOptions(**{name: flags.pop(name) for name in declared if name in flags})
    spec = prediction_spec.resolve(job_id, resume=resume, **flags)
    return submission.submit_prediction(spec, runner, options, echo, dry_run=dry_run,
                                        stream=not run_async)


__all__ = ["prediction_command"]
