"""`jobs submit|list|describe|stream-logs|cancel|wait|update`, as `gcloud ai-platform
jobs` (`wait` is mljob's: block until the job ends).

`jobs list` and `jobs describe` print Cloud ML's Job resource (`submit.resource`) in
gcloud's `--format`s; describe's default is its YAML (as gcloud's), and hints go to
stderr so that stdout stays the resource alone. `jobs submit` is a group: its commands
(`training`, and others) are added by `submit.__main__`. The job commands are the
Python API's (`submit.api`) calls, printed: what the API returns or raises is what they
print or exit with.
"""
from __future__ import annotations

import logging
import os

import click

from submit import api, jobs as records, resource, submission, training_output
from submit.cli import formats
from submit.local import usage
from submit.jobdef import spec as specs
from submit.cli.cli_base import GcloudGroup, cli, echo
from submit.errors import EXIT_OK, JobNotFoundError, SubmitError, UsageError
from submit.runners.engine import SUPERVISOR

log = logging.getLogger(__name__)
LIST_KEYS = [("jobId", "JOB_ID"), ("state", "STATUS"), ("createTime", "CREATED")]


@cli.group("jobs", cls=GcloudGroup)
def jobs_group():
    """Submit, list, describe, follow, cancel and update jobs (the local index in
    $MLJOB_HOME records every job, whatever its runner)."""


@jobs_group.group("submit", cls=GcloudGroup)
def jobs_submit():
    """Submit a job: `training` (as `gcloud ai-platform jobs submit training`)."""


@jobs_group.command("list")
@click.option("--filter", "filter_text", help="gcloud's simple filters, e.g. state=RUNNING, "
                                              "labels.team=vision, jobId:job1*.")
@click.option("--sort-by", help="Field(s) to sort by, ~ to reverse, e.g. ~createTime.")
@click.option("--limit", type=int, help="At most this many jobs.")
@click.option("--page-size", type=int,
              help="Jobs read and printed at a time (the output is the same).")
@click.option("--uri", is_flag=True, help="Print each job's URI (its record) only.")
@formats.FORMAT_OPTION
def jobs_list(filter_text, sort_by, limit, page_size, uri, fmt):
    """Jobs in the local index, oldest first."""
    if page_size is not None and page_size < 1:
        raise UsageError(f"--page-size {page_size} must be 1 or more")
    if uri and fmt:
        raise UsageError("--uri and --format both say what to print; give one")
    # The index's summary (submit.job_index): the whole records only of the chosen jobs.
    chosen = api.select(filter_text, sort_by=sort_by, limit=limit)
    if uri:
        for r in chosen:
            echo(resource.uri(r))
        return EXIT_OK
    if fmt:
        formats.emit(echo, [api.job_resource(r) for r in _whole(chosen)], fmt,
                     single=False, default_keys=LIST_KEYS)
        return EXIT_OK
    echo(f"{'JOB_ID':<24} {'STATUS':<11} {'CREATED':<20} JOB_DIR")
    size = page_size or len(chosen) or 1
    for first in range(0, len(chosen), size):
        echo("\n".join(f"{r.job_id:<24} {state(r):<11} "
                       f"{resource.rfc3339(r.create_time):<20} {r.job_dir or '-'}"
                       for r in chosen[first:first + size]))
    return EXIT_OK


def _whole(chosen: list[records.JobRecord]) -> list[records.JobRecord]:
    """The chosen jobs' whole records (a record removed meanwhile is left out)."""
    out = []
    for light in chosen:
        try:
            out.append(records.load(light.job_id))
        except (JobNotFoundError, SubmitError) as exc:
            log.warning("%s", exc)
    return out


@jobs_group.command("describe")
@click.argument("job_id")
@click.option("--summarize", is_flag=True,
              help="Tables of the job's overview, input and output instead of the "
                   "whole resource.")
@formats.FORMAT_OPTION
def jobs_describe(job_id, summarize, fmt):
    """The job as Cloud ML's Job resource (YAML unless --format says otherwise); our own
    fields (runner, replicas, PIDs, restarts, log paths) are under `mljob`."""
    if summarize and fmt:
        raise UsageError("--summarize and --format both say what to print; give one")
    record = api.get_job(job_id).record()
    job = api.job_resource(record)
    if summarize:
        echo(summary(job))
    else:
        formats.emit(echo, [job], fmt or "yaml", single=True)
    if not fmt:
        # for a reader, on stderr so that stdout stays the resource alone
        if record.replicas and not summarize:
            echo("\nReplicas:\n" + "\n".join(records.replica_lines(record)), err=True)
        if cost := usage.summary_of(record):
            echo("\nCPU (cores in use) and memory per replica:\n" + usage.table(cost),
                 err=True)
        echo(f"\nView the logs:\n  python -m submit jobs stream-logs {job_id}", err=True)
        if record.job_dir:
            logdir = record.job_dir
            if logdir.startswith("memory://"):  # TensorBoard cannot read this process's
                logdir = os.path.dirname(record.log_dir or "")
            echo(f"View metrics in TensorBoard:\n  tensorboard --logdir {logdir}",
                 err=True)
    return EXIT_OK


def summary(job: dict) -> str:
    """`--summarize`: the job's overview, its input and its output as tables."""
    overview = [["JOB_ID", "STATE", "CREATED", "STARTED", "ENDED", "LABELS"],
                [formats.cell(job.get(k)) for k in ("jobId", "state", "createTime",
                                                   "startTime", "endTime", "labels")]]
    parts = ["Job Overview", formats.table(overview)]
    if job.get("errorMessage"):
        parts.append(f"Error: {job['errorMessage']}")
    if "predictionInput" in job:  # a batch prediction job: no training sections
        parts += _prediction_summary(job)
    else:
        parts += _training_summary(job)
    own = job.get(resource.OWN_KEY, {})
    replicas = own.get("replicas") or []
    if replicas:
        fields = ["label", "state", "pid", "exitCode", "restarts"]
        parts += ["", "Replicas",
                  formats.table([[formats.heading(f) for f in fields]] +
                                [[formats.cell(r.get(f)) for f in fields]
                                 for r in replicas])]
    return "\n".join(parts)


def _training_summary(job: dict) -> list[str]:
    ti = job.get("trainingInput") or {}
    keys = [k for k in ("scaleTier", "masterType", "workerCount", "parameterServerCount",
                        "evaluatorCount", "region", "runtimeVersion", "pythonModule",
                        "jobDir") if k in ti]
    parts = ["", "Training Input Summary",
             formats.table([[formats.heading(k) for k in keys],
                            [formats.cell(ti[k]) for k in keys]])]
    out = job.get("trainingOutput") or {}
    if out.get("trials"):
        parts += ["", f"Training Output Summary ({out.get('completedTrialCount', '0')} "
                  "trials completed; best first)", training_output.trials_table(out)]
    return parts


def _prediction_summary(job: dict) -> list[str]:
    """Cloud ML's prediction sections: the input (model, data, output path) and, once
    counted, the output (predictions, errors)."""
    parts = []
    for title, section, keys in (
            ("Prediction Input Summary", job.get("predictionInput") or {},
             ("modelName", "versionName", "uri", "dataFormat", "inputPaths", "outputPath",
              "region", "maxWorkerCount", "batchSize")),
            ("Prediction Output Summary", job.get("predictionOutput") or {},
             ("predictionCount", "errorCount", "nodeHours", "outputPath"))):
        shown = [k for k in keys if k in section]
        if shown:
            parts += ["", title, formats.table([[formats.heading(k) for k in shown],
                                                [formats.cell(section[k]) for k in shown]])]
    return parts


@jobs_group.command("stream-logs")
@click.argument("job_id")
@click.option("--task-name", help="Only this replica, e.g. master-replica-0.")
@click.option("--polling-interval", type=click.IntRange(1), metavar="SECONDS",
              help="gcloud's seconds between log reads: taken; lines show as they are "
                   "written here.")
@click.option("--allow-multiline-logs", is_flag=True,
              help="gcloud's multiline records: taken; a replica's lines (a traceback "
                   "too) print whole, in order.")
def jobs_stream_logs(job_id, task_name, polling_interval, allow_multiline_logs):
    """Print the job's logs and follow them until the job ends."""
    if polling_interval is not None:
        echo(f"--polling-interval {polling_interval}: no effect here, lines show as the "
             "replicas write them (the runner reads them about every second)", err=True)
    if allow_multiline_logs:
        echo("--allow-multiline-logs: no effect here, each line of a replica's output "
             "prints as written, so a multiline message prints whole", err=True)
    try:
        return api.get_job(job_id).follow(echo, task_name=task_name)
    except KeyboardInterrupt:  # the API's follow said so and raised it again
        return api.JobCancelled.exit_status


@jobs_group.command("cancel")
@click.argument("job_id")
def jobs_cancel(job_id):
    """Cancel a running job: every replica is stopped, then the job is CANCELLED."""
    job = api.get_job(job_id).cancel()
    echo(f"Job [{job_id}] {job.record(refresh=False).state}.")
    return EXIT_OK


@jobs_group.command("wait")
@click.argument("job_id")
@click.option("--timeout", type=click.FloatRange(0, min_open=True), metavar="SECONDS",
              help="Give up after this long (exit 1; the job goes on) [default: wait "
                   "until it ends].")
def jobs_wait(job_id, timeout):
    """Wait until the job ends: exit 0 when it SUCCEEDED, else the status of `jobs
    stream-logs` (failed 1, cancelled 130) with its one line."""
    api.get_job(job_id).wait(timeout, progress=False)
    echo(f"Job [{job_id}] SUCCEEDED.")
    return EXIT_OK


@jobs_group.command("update")
@click.argument("job_id")
@click.option("--update-labels", multiple=True, metavar="KEY=VALUE,...",
              help="Labels to add or change.")
@click.option("--remove-labels", multiple=True, metavar="KEY,...",
              help="Label keys to remove (after --update-labels; a missing key is "
                   "ignored).")
@click.option("--clear-labels", is_flag=True,
              help="Remove every label (before --update-labels).")
@click.option("--etag", help="The job's etag as `jobs describe` printed it: the update is "
                             "refused if the job changed since.")
def jobs_update(job_id, update_labels, remove_labels, clear_labels, etag):
    """Change a job's labels, as `gcloud ai-platform jobs update`: on the engine where it
    keeps them (a Kubeflow TFJob's labels), and in the job's record."""
    if clear_labels and remove_labels:
        raise UsageError("--clear-labels and --remove-labels: give at most one of them")
    if not (update_labels or remove_labels or clear_labels):
        raise UsageError("nothing to update; give --update-labels KEY=VALUE,..., "
                         "--remove-labels KEY,... or --clear-labels")
    with resource.labels_lock(job_id):  # compare and write as one step
        record = records.load(job_id)
        if etag is not None:
            current = resource.job(record, state(record).rstrip("?"))["etag"]
            if etag != current:
                raise SubmitError(f"--etag {etag!r:.40} is not job {job_id}'s etag "
                                  f"{current}: the job changed since it was read; describe "
                                  "it again and retry")
        old = resource.current_labels(record)
        labels = {} if clear_labels else dict(old)
        labels.update(specs.parse_labels_flag(update_labels) if update_labels else {})
        for text in remove_labels:
            for key in filter(None, (k.strip() for k in text.split(","))):
                labels.pop(key, None)
        labels = specs.check_labels(labels, "the job's labels after the update")
        runner = submission.runner_for(record)
        note = runner.update_labels(record, old, labels)
        resource.save_labels(record, labels)
        if not record.running() or runner.record_owner != SUPERVISOR:
            record.labels = labels  # no supervisor owns the record now: it is ours to write
            records.save(record, create_in_job_dir=False)
    if note:
        echo(note, err=True)
    echo(f"Updated job [{job_id}].")
    return EXIT_OK


def state(record: records.JobRecord) -> str:
    if not record.done and record.supervisor_pid and not record.supervisor_alive():
        return f"{record.state}?"  # its supervisor is gone: `jobs cancel` cleans up
    return record.state
