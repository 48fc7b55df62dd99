"""python -m submit: submit a training job, manage jobs, or train locally.

    python -m submit JOB_ID [options] [-- trainer args]      submit (and by default stream)
    python -m submit jobs list|describe|stream-logs|cancel    manage submitted jobs
    python -m submit local train [--distributed ...] [-- args] run the working tree

This module holds the command line and its output only: the submission itself is
`submit.submission`, and `--runner` picks a runner (`submit.runners`) that every command
talks to through the same interface.

It is the one top layer: library errors (`submit.errors`, storage and click errors)
become a one-line `error: ...` on stderr and an exit status (2 for usage).
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import time

import click
import yaml

from mljob import storage
from submit import jobs as records
from submit import listing, package, plan as plans, runners, spec as specs, submission
from submit import cmd_prediction
from submit.errors import EXIT_OK, EXIT_USAGE, JobCancelled, SubmitError, UsageError
from submit.runners import local
from submit.runners.engine import EngineOptions

_NoArgsIsHelp = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2
TIERS = tuple(specs.SCALE_TIERS)


class MainGroup(click.Group):
    """`submit` is the default command: `python -m submit job01 ...` means
    `python -m submit submit job01 ...` unless the first word names a subcommand."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["submit", *args]
        return super().parse_args(ctx, args)


class TrainerArgsCommand(click.Command):
    """Everything after `--` belongs to the trainer; stray words before it are errors."""

    def parse_args(self, ctx, args):
        if "--" in args:
            cut = args.index("--")
            ctx.meta["trainer_args"] = tuple(args[cut + 1:])
            args = args[:cut]
        else:
            ctx.meta["trainer_args"] = None
        return super().parse_args(ctx, args)


@click.group(cls=MainGroup, context_settings={"help_option_names": ["-h", "--help"]})
def cli():
    """Run TensorFlow training jobs as Cloud ML Engine did: as processes on this machine,
    or (--runner kubeflow|vertex) on a Kubeflow cluster or Vertex AI.

    \b
    python -m submit JOB_ID [options] [-- trainer args]
        Submit a job (the `submit` command; see `python -m submit submit --help`).
    python -m submit jobs list | describe JOB | stream-logs JOB | cancel JOB
        Manage submitted jobs (`python -m submit jobs --help`).
    python -m submit local train [--distributed] [-- trainer args]
        Run the working tree's trainer locally without staging.
    """


@cli.command("submit", cls=TrainerArgsCommand)
@click.argument("job_id")
@click.option("--scale-tier", type=click.Choice(TIERS, case_sensitive=False),
              help="Cluster shape (default BASIC, or the config's scaleTier).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="config.yaml or JSON shaped like Cloud ML's Job (trainingInput).")
@click.option("--job-dir", help="Job output URL: path, file://, memory:// or gs://.")
@click.option("--staging-bucket", help="Where packages are staged (else <job-dir>/packages).")
@click.option("--package-path", type=click.Path(file_okay=False),
              help="Your package folder (e.g. trainer), built from its parent with the "
                   "parent's setup.py or a generated one; or a folder holding setup.py "
                   "(default: this project's source tree).")
@click.option("--packages", "packages", multiple=True,
              help="Comma-separated sdists (.tar.gz) or wheels (.whl), paths or URLs, "
                   "staged and installed with the package.")
@click.option("--module-name", help="Module each replica runs (default trainer.task).")
@click.option("--worker-count", type=int, help="Workers (CUSTOM tier only).")
@click.option("--parameter-server-count", type=int, help="Parameter servers (CUSTOM only).")
@click.option("--evaluator-count", type=int, help="Evaluators (CUSTOM tier only).")
@click.option("--stream-logs/--async", "stream_logs", default=True,
              help="Follow the job's logs until it ends (default), or return at once.")
@click.option("--dry-run", is_flag=True,
              help="Print the resolved plan as JSON; run, stage and record nothing. To "
                   "show the package's URL and hash it builds the sdist (runs your "
                   "setup.py sdist in a temporary copy); give built archives (--packages, "
                   "or packageUris in --config) to run none.")
@click.option("--resume", is_flag=True, help="Reuse a job id already used in the job dir.")
@click.option("--restart-policy", default=None,
              type=click.Choice(specs.RESTART_POLICIES),
              help="When a replica that exits is started again, for every replica type "
                   "[default: each type's restartPolicy in --config, else Never].")
@click.option("--max-restarts", default=None, type=int,
              help="Restarts allowed per replica [default: each type's maxRestarts in "
                   f"--config, else {specs.DEFAULT_MAX_RESTARTS} with a restart policy, "
                   "0 without].")
@click.option("--labels", multiple=True, metavar="KEY=VALUE,...",
              help="Labels for the job, added to (and overriding) the config's labels.")
@click.option("--master-machine-type", help="The master's machine (CUSTOM tier), e.g. "
                                            "n1-standard-4 or standard.")
@click.option("--worker-machine-type", help="The workers' machine (CUSTOM tier).")
@click.option("--parameter-server-machine-type", help="The parameter servers' machine "
                                                      "(CUSTOM tier).")
@click.option("--master-accelerator", metavar="count=N,type=TYPE",
              help="GPUs per master (CUSTOM tier), e.g. count=1,type=nvidia-tesla-t4.")
@click.option("--worker-accelerator", metavar="count=N,type=TYPE",
              help="GPUs per worker (CUSTOM tier).")
@click.option("--parameter-server-accelerator", metavar="count=N,type=TYPE",
              help="GPUs per parameter server (CUSTOM tier).")
@click.option("--use-chief-in-tf-config/--no-use-chief-in-tf-config", default=None,
              help="Name the chief `chief` in TF_CONFIG, not `master` [default: the "
                   "config's useChiefInTfConfig, else by runtimeVersion: master before "
                   "2.1].")
@click.option("--runner", default="local", show_default=True,
              type=click.Choice(tuple(runners.RUNNERS)),
              help="Where the job runs: processes on this machine, a Kubeflow TFJob on "
                   "the current kubeconfig's cluster, or a Vertex AI CustomJob.")
@click.option("--image", help="kubeflow: the container image holding the trainer (see "
                              "the Dockerfile --dry-run prints); vertex: the executor "
                              "image the package is installed into.")
@click.option("--namespace", help="kubeflow: the namespace [default: the kubeconfig "
                                  "context's, else default].")
@click.option("--kube-context", "context", help="kubeflow: the kubeconfig context "
                                                "[default: the current one].")
@click.option("--project", help="vertex: the Google Cloud project [default: "
                                "$GOOGLE_CLOUD_PROJECT].")
@click.option("--region", help="The region, recorded in trainingInput; vertex runs the "
                               "job there [default: the config's region, else us-central1].")
@click.option("--runtime-version", help="Cloud ML's runtime version (e.g. 2.11), recorded "
                                        "in trainingInput.")
@click.option("--python-version", help="Cloud ML's Python version (e.g. 3.7), recorded in "
                                       "trainingInput.")
@click.option("--service-account", help="kubeflow: the pods' service account; vertex: "
                                        "the service account email replicas run as.")
@click.pass_context
def submit_command(ctx, job_id, scale_tier, config_path, job_dir, staging_bucket,
                   package_path, packages, module_name, worker_count,
                   parameter_server_count, evaluator_count, stream_logs, dry_run, resume,
                   restart_policy, max_restarts, runner, image, namespace, context, project,
                   region, runtime_version, python_version, service_account,
                   **job_definition):
    """Submit training job JOB_ID; everything after `--` goes to the trainer, followed by
    `--job-dir URL` as Cloud ML passes it."""
    options = EngineOptions(image=image, namespace=namespace, context=context,
                            project=project, region=region,
                            service_account=service_account)
    options.check_for(runner)
    return submission.submit(submission.Submission(
        job_id, runner=runner, options=options, config_path=config_path,
        resolve=dict(scale_tier=scale_tier, worker_count=worker_count,
                     parameter_server_count=parameter_server_count,
                     evaluator_count=evaluator_count, job_dir=job_dir,
                     staging_bucket=staging_bucket, package_path=package_path,
                     module_name=module_name, args=ctx.meta["trainer_args"],
                     restart_policy=restart_policy, max_restarts=max_restarts,
                     packages=[p for given in packages for p in given.split(",") if p]
                     if packages else None, region=region,
                     runtime_version=runtime_version, python_version=python_version,
                     **job_definition),
        dry_run=dry_run, stream=stream_logs, resume=resume), _echo)


@cli.command("_supervise", hidden=True)
@click.argument("plan_file", type=click.Path(exists=True, dir_okay=False))
def supervise_command(plan_file):
    """Run a submitted job to its end (started detached by --async)."""
    with open(plan_file) as f:
        plan = plans.JobPlan.from_dict(json.load(f))
    return local.run(plan, records.load(plan.job_id), _echo, stream=False)


@cli.group("jobs")
def jobs_group():
    """List, describe, follow and cancel jobs (from the local index in $MLJOB_HOME)."""


@jobs_group.command("list")
@click.option("--filter", "filter_text", help="gcloud's simple filters, e.g. state=RUNNING, "
                                              "labels.team=vision, jobId:job1*.")
@click.option("--sort-by", help="Field(s) to sort by, ~ to reverse, e.g. ~createTime.")
@click.option("--limit", type=int, help="At most this many jobs.")
def jobs_list(filter_text, sort_by, limit):
    """Jobs in the local index, oldest first."""
    chosen = listing.select(records.list_all(), filter_text=filter_text, sort_by=sort_by,
                            limit=limit)
    click.echo(f"{'JOB_ID':<24} {'STATUS':<11} {'CREATED':<20} JOB_DIR")
    for r in chosen:
        click.echo(f"{r.job_id:<24} {_state(r):<11} {_iso(r.create_time):<20} "
                   f"{r.job_dir or '-'}")
    return EXIT_OK


@jobs_group.command("describe")
@click.argument("job_id")
def jobs_describe(job_id):
    """The job's record, and how to look at it with TensorBoard."""
    record = records.load(job_id)
    record = submission.runner_for(record).refresh(record)
    data = json.loads(record.to_json())
    data["state"] = _state(record)
    for key in ("create_time", "start_time", "end_time"):
        if data.get(key):
            data[key] = _iso(data[key])
    click.echo(yaml.safe_dump(data, sort_keys=True, default_flow_style=False).rstrip())
    if record.replicas:
        click.echo("\nReplicas:\n" + "\n".join(records.replica_lines(record)))
    if record.training_output.get("trials"):
        from submit import tuning
        click.echo("\nTrials, best first:\n" + tuning.trials_table(record.training_output))
    from submit import usage
    if cost := usage.summary_of(record):
        click.echo("\nCPU (cores in use) and memory per replica:\n" + usage.table(cost))
    click.echo(f"\nView the logs:\n  python -m submit jobs stream-logs {job_id}")
    if record.job_dir:
        logdir = record.job_dir
        if logdir.startswith("memory://"):  # TensorBoard cannot read this process's store
            logdir = os.path.dirname(record.log_dir)
        click.echo(f"View metrics in TensorBoard:\n  tensorboard --logdir {logdir}")
    return EXIT_OK


@jobs_group.command("stream-logs")
@click.argument("job_id")
@click.option("--task-name", help="Only this replica, e.g. master-replica-0.")
def jobs_stream_logs(job_id, task_name):
    """Print the job's logs and follow them until the job ends."""
    record = records.load(job_id)
    return submission.runner_for(record).follow(record, _echo, task_name=task_name)


@jobs_group.command("cancel")
@click.argument("job_id")
def jobs_cancel(job_id):
    """Cancel a running job: every replica is stopped, then the job is CANCELLED."""
    record = records.load(job_id)
    record = submission.runner_for(record).cancel_job(record)
    click.echo(f"Job [{job_id}] {record.state}.")
    return EXIT_OK


@cli.command("console")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 shows your jobs to the network).")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0 picks a free one).")
def console_command(host, port):
    """The jobs of the local index in a browser: states, replicas, live logs, trials,
    CPU and memory, cancel."""
    from submit import console
    return console.serve(host, port, _echo)


def _iso(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


def _state(record: records.JobRecord) -> str:
    if not record.done and record.supervisor_pid and not record.supervisor_alive():
        return f"{record.state}?"  # its supervisor is gone: `jobs cancel` cleans up
    return record.state


@cli.group("local")
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
    spec = specs.resolve(job_id, {"masterType": "standard"}, scale_tier="CUSTOM",
                         job_dir=job_dir, module_name=module_name,
                         args=ctx.meta["trainer_args"] or (), staged=False, **flags)
    source = package.check_package_path(package_path)
    n = sum(spec.count(t) for t in (specs.CHIEF, specs.WORKER, specs.PS))
    if start_port is not None and start_port + n - 1 > 65535:
        raise UsageError(f"--start-port {start_port} leaves too few ports for {n} replicas")
    ports = list(range(start_port, start_port + n)) if start_port else None
    runner = local.LocalEngine(EngineOptions(), ports=ports, source_dir=source)
    rendered = runner.render(spec, None)
    return submission.start(runner, rendered, runner.new_record(spec, None, rendered),
                            _echo, stream=True)


cmd_prediction.register(cli, jobs_group)  # `jobs submit prediction`


def main(argv=None, standalone_mode: bool = True):
    """Console entry point; returns the exit status when standalone_mode is False."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="warning: %(message)s")
    status = _main(argv)
    if standalone_mode:
        sys.exit(status)
    return status


def _main(argv) -> int:
    try:
        result = cli.main(args=argv, prog_name="python -m submit", standalone_mode=False)
        return result if isinstance(result, int) else EXIT_OK
    except SubmitError as exc:
        _error(str(exc))
        return exc.exit_status
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except _NoArgsIsHelp as exc:  # a bare group: show its help, as click would
        click.echo(exc.ctx.get_help(), err=True)
        return EXIT_USAGE
    except click.ClickException as exc:
        _error(f"{exc.format_message()} (see python -m submit --help)")
        return EXIT_USAGE
    except click.exceptions.Abort:
        return JobCancelled.exit_status
    except (storage.StorageError, OSError) as exc:
        _error(str(exc))
        return 1


def _error(message: str) -> None:
    click.echo("error: " + " ".join(message.split()), err=True)


def _echo(text: str, err: bool = False) -> None:
    click.echo(text, err=err)


if __name__ == "__main__":
    main()
