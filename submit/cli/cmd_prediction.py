"""`python -m submit jobs submit prediction JOB ...`: Cloud ML's batch prediction job.

The command checks every flag, the model, the inputs and the output path before
anything is recorded (a mistake is one line and exit status 2), plans the shards, then
records the job in the local index and runs it (`submit.prediction.job`): in the
foreground, following its logs (Ctrl-C cancels it), or with `--async` under a detached
supervisor. `--runner vertex|kubeflow` renders the engine's own job instead
(`submit.prediction.render`).

`submit.__main__` adds the command to `jobs submit`, and the hidden
`_supervise prediction` that a detached job runs under to the CLI.
"""
from __future__ import annotations

import os

import click

from mljob import storage
from submit import jobs
from submit.prediction import spec as prediction_spec
from submit.runners.engine import EngineOptions
from submit.prediction.plan import build_plan
from submit.prediction.job import PredictionJob, PredictionPlan
from submit.lifecycle import ended

RUNNERS = ("local", "vertex", "kubeflow")


@click.command("prediction")
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
@click.option("--runner", default="local", show_default=True, type=click.Choice(RUNNERS))
@click.option("--dry-run", is_flag=True, help="Print the job (the local plan, the Vertex "
              "BatchPredictionJob or the Kubernetes Job); run nothing.")
@click.option("--project", help="vertex: the Google Cloud project.")
@click.option("--image", help="kubeflow: the image holding mljob (vertex: the prediction "
                              "container for --model-dir).")
@click.option("--namespace", help="kubeflow: the namespace [default: default].")
def prediction_command(job_id, run_async, resume, runner, dry_run, project, image,
                       namespace, **flags):
    """Submit batch prediction job JOB_ID, as `gcloud ai-platform jobs submit prediction`."""
    spec = prediction_spec.resolve(job_id, **flags)
    # the runners' own declarations say which runner takes which option
    EngineOptions(project=project, image=image, namespace=namespace).check_for(runner)
    if runner != "local":
        from submit.prediction import render as prediction_render
        return prediction_render.submit(spec, runner, project=project, image=image,
                                        namespace=namespace, dry_run=dry_run,
                                        echo=click.echo)
    plan = build_plan(spec, resume=resume)
    if dry_run:
        click.echo(plan.to_json())
        return 0
    record = new_record(spec, plan)
    os.makedirs(plan.run_dir, exist_ok=True)
    storage.write_bytes(plan.job_file, plan.to_json().encode())
    jobs.save(record)
    click.echo(f"Job [{job_id}] submitted successfully.")
    if run_async:
        record.adopt_supervisor(_detach(plan))
        jobs.save(record)
        click.echo(f"Supervisor pid {record.supervisor_pid}. Follow the job with:\n"
                   f"  python -m submit jobs stream-logs {job_id}\n"
                   f"  python -m submit jobs describe {job_id}")
        return 0
    return run(plan, record, stream=True)


def supervise_file(plan_file: str) -> int:
    """Run a batch prediction job to its end (`_supervise prediction`, started detached
    by --async)."""
    with open(plan_file, "rb") as f:
        plan = PredictionPlan.from_json(f.read())
    return run(plan, jobs.load(plan.job_id), stream=False)


def new_record(spec: prediction_spec.PredictionSpec, plan: PredictionPlan) -> jobs.JobRecord:
    record = jobs.JobRecord(job_id=spec.job_id, log_dir=plan.log_dir, mode="prediction",
                            runner="local", labels=dict(spec.labels),
                            prediction_input=spec.prediction_input())
    record.prediction_output = {"outputPath": spec.output_path}
    return record


def run(plan: PredictionPlan, record: jobs.JobRecord, *, stream: bool) -> int:
    """Supervise the job in this process, holding its lock; its exit status."""
    from submit.local import entry
    state = entry.supervise(record, lambda terminal: PredictionJob(
        plan, record, publish=jobs.save, terminal=terminal).run(), stream=stream)
    click.echo(f"Job [{plan.job_id}] {state}.")
    return ended(record, f"; see {plan.log_dir}")


def _detach(plan: PredictionPlan) -> int:
    from submit.local import entry
    return entry.detach("prediction", plan.job_id, plan.run_dir, plan.job_file)


__all__ = ["prediction_command", "supervise_file", "run"]
