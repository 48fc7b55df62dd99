"""`python -m submit jobs submit prediction JOB ...`: Cloud ML's batch prediction job.

The command checks every flag, the model, the inputs and the output path before
anything is recorded (a mistake is one line and exit status 2), plans the shards, then
records the job in the local index and runs it (`submit.prediction_job`): in the
foreground, following its logs (Ctrl-C cancels it), or with `--async` under a detached
supervisor. `--runner vertex|kubeflow` renders the engine's own job instead
(`submit.runners.prediction_render`).

`register(cli, jobs_group)` adds the command (and the hidden `_supervise-prediction`
that a detached job runs under) to the CLI.
"""
from __future__ import annotations

import os
import subprocess
import sys

import click

from mljob import contracts, storage
from submit import jobs, logs, prediction_spec
from submit.errors import JobNotFoundError, UsageError
from submit.package import mljob_home
from submit.prediction_job import PredictionJob, PredictionPlan
from submit.prediction_output import check_output, read_marker
from submit.runners.engine import ended

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
    engine_flags = {"--project": project, "--image": image, "--namespace": namespace}
    owners = {"--project": ("vertex",), "--image": ("vertex", "kubeflow"),
              "--namespace": ("kubeflow",)}
    for flag, value in engine_flags.items():
        if value is not None and runner not in owners[flag]:
            raise UsageError(f"{flag} is for --runner {' or '.join(owners[flag])}, not "
                             f"--runner {runner}; drop it or change --runner")
    if runner != "local":
        from submit.runners import prediction_render
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


@click.command("_supervise-prediction", hidden=True)
@click.argument("plan_file", type=click.Path(exists=True, dir_okay=False))
def supervise_command(plan_file):
    """Run a batch prediction job to its end (started detached by --async)."""
    with open(plan_file, "rb") as f:
        plan = PredictionPlan.from_json(f.read())
    return run(plan, jobs.load(plan.job_id), stream=False)


def register(cli: click.Group, jobs_group: click.Group) -> None:
    """`jobs submit prediction` (making the `jobs submit` group if there is none yet)."""
    group = jobs_group.commands.get("submit")
    if not isinstance(group, click.Group):
        group = click.Group("submit", help="Submit a job (as `gcloud ai-platform jobs "
                                           "submit`).")
        jobs_group.add_command(group)
    group.add_command(prediction_command)
    cli.add_command(supervise_command)


def build_plan(spec: prediction_spec.PredictionSpec, *, resume: bool) -> PredictionPlan:
    """Everything checked (the job id, model, inputs and output) and the shards planned;
    --resume keeps the shards of the job's earlier run."""
    from predict import batch, shards
    from predict.errors import PredictError
    home = mljob_home()
    _check_job_id(spec, resume)
    model_dir = prediction_spec.local_model_dir(spec, home)
    run_dir = os.path.join(home, "runs", spec.job_id)
    try:
        _check_model(model_dir)
        check_output(spec.output_path, spec.job_id, resume)
        earlier = _earlier_plan(run_dir, spec) if resume else None
        if earlier is not None:
            planned = earlier.shards
        else:
            if resume and read_marker(spec.output_path) is not None:
                raise UsageError(f"cannot resume job {spec.job_id}: its shard plan in "
                                 f"{run_dir} is gone; choose a new --output-path")
            files = batch.expand_inputs(",".join(spec.input_paths))
            planned = [s.to_dict() for s in shards.plan(files, spec.data_format,
                                                        parts=spec.max_worker_count)]
    except PredictError as exc:
        raise UsageError(str(exc)) from None
    return PredictionPlan(
        job_id=spec.job_id, model_dir=model_dir, output_path=spec.output_path,
        data_format=spec.data_format, shards=planned, workers=spec.max_worker_count,
        batch_size=spec.batch_size, signature_name=spec.signature_name, run_dir=run_dir,
        log_dir=os.path.join(run_dir, "logs"), prediction_input=spec.prediction_input())


def new_record(spec: prediction_spec.PredictionSpec, plan: PredictionPlan) -> jobs.JobRecord:
    record = jobs.JobRecord(job_id=spec.job_id, log_dir=plan.log_dir, mode="prediction",
                            runner="local", labels=dict(spec.labels),
                            prediction_input=spec.prediction_input())
    record.prediction_output = {"outputPath": spec.output_path}
    return record


def run(plan: PredictionPlan, record: jobs.JobRecord, *, stream: bool) -> int:
    """Supervise the job in this process, holding its lock; its exit status."""
    from submit.runners.local import _hold_lock
    lock = _hold_lock(record.job_id)
    try:
        record.adopt_supervisor()
        jobs.save(record)
        terminal = logs.Terminal(sys.stdout, stream=stream)
        state = PredictionJob(plan, record, publish=jobs.save, terminal=terminal).run()
    finally:
        lock.close()
    click.echo(f"Job [{plan.job_id}] {state}.")
    return ended(record, f"; see {plan.log_dir}")


def _detach(plan: PredictionPlan) -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, contracts.MLJOB_JOB_ID_ENV: plan.job_id,
           "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(os.path.join(plan.run_dir, "supervisor.log"), "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "submit", "_supervise-prediction", plan.job_file],
            cwd=plan.run_dir, env=env, stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True)
    return proc.pid


def _check_job_id(spec: prediction_spec.PredictionSpec, resume: bool) -> None:
    try:
        old = jobs.load(spec.job_id)
    except JobNotFoundError:
        return
    if old.running():
        raise UsageError(f"job {spec.job_id!r} is still {old.state}; cancel it with "
                         f"`python -m submit jobs cancel {spec.job_id}` or pick another id")
    earlier_output = old.prediction_input.get("outputPath")
    if not resume or earlier_output != spec.output_path:
        again = (f", or pass --resume with --output-path {earlier_output} to finish it"
                 if earlier_output and old.state != jobs.SUCCEEDED else "")
        raise UsageError(f"job id {spec.job_id!r} already exists ({old.state}); pick "
                         f"another job id{again}")


def _check_model(model_dir: str) -> None:
    names = (contracts.SAVED_MODEL_MARKER, contracts.LEGACY_EXPORT_MARKER)
    if not any(storage.exists(storage.join(model_dir, n)) for n in names):
        raise UsageError(f"--model-dir {model_dir} holds no export ({' or '.join(names)} "
                         "missing); pass the export folder, <job-dir>/model")


def _earlier_plan(run_dir: str, spec) -> PredictionPlan | None:
    try:
        with open(os.path.join(run_dir, "prediction.json"), "rb") as f:
            earlier = PredictionPlan.from_json(f.read())
    except (OSError, ValueError, TypeError):
        return None
    return earlier if earlier.output_path == spec.output_path else None


__all__ = ["register", "prediction_command", "build_plan", "run"]
