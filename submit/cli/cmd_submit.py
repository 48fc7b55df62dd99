"""`jobs submit training JOB_ID` and its short form `python -m submit JOB_ID`: the flags
of `gcloud ai-platform jobs submit training`, handed to the Python API's
`run_submission` (submit.api), which `api.submit` runs too."""
from __future__ import annotations

import click

from submit import api, runners
from submit.jobdef import spec as specs
from submit.cli.cli_base import TrainerArgsCommand, cli, echo


def runner_params() -> list[click.Option]:
    """`--runner` and every runner's own options, built from the runners' declarations
    (`submit.runners.OPTIONS`): a new runner's options appear here without a line in
    this module."""
    return [click.Option(
        ["--runner"], default="local", show_default=True,
        type=click.Choice(tuple(runners.RUNNERS)),
        help="Where the job runs: processes on this machine, a Kubeflow TFJob on the "
             "current kubeconfig's cluster, a Vertex AI CustomJob, or a job on a Ray "
             "cluster."), *declared_params()]


def declared_params(*, prediction: bool = False) -> list[click.Option]:
    """The runners' own options as click options (`prediction`: those a batch
    prediction job takes, `RunOpt.prediction`)."""
    params = []
    for name, declared in runners.declared_options(prediction=prediction).items():
        opt = declared.opt
        params.append(click.Option(
            [opt.option, name], metavar=opt.metavar, help=declared.help + ".",
            type=click.Choice(opt.choices, case_sensitive=False) if opt.choices else None))
    return params


class RunnerParams:
    """A command's own flags, then the runners' (`declared()`, read from their
    declarations when the command is parsed or its help shown), then click's --help."""

    def declared(self) -> list[click.Option]:
        return runner_params()

    def get_params(self, ctx):
        params = super().get_params(ctx)
        key = f"runner_params:{self.name}"
        if key not in ctx.meta:
            ctx.meta[key] = self.declared()
        own = self.params
        return [*own, *ctx.meta[key], *params[len(own):]]


class TrainingCommand(RunnerParams, TrainerArgsCommand):
    """`jobs submit training`: its own flags, `--runner` and every runner's options."""


def training_options(command):
    """gcloud's `jobs submit training` flags, and the runners' own."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


_OPTIONS = [
    click.option("--scale-tier", metavar="TIER",
                 help="Cluster shape: basic, basic-gpu, standard-1, premium-1 or custom, in "
                      "any of gcloud's spellings (STANDARD_1, standard_1) [default: the "
                      "config's scaleTier, else basic]."),
    click.option("--config", "config_path", type=click.Path(dir_okay=False),
                 help="config.yaml or JSON shaped like Cloud ML's Job (trainingInput)."),
    click.option("--job-dir", help="Job output URL: path, file://, memory:// or gs://."),
    click.option("--staging-bucket", help="Where packages are staged (else <job-dir>/packages)."),
    click.option("--package-path", type=click.Path(file_okay=False),
                 help="Your package folder (e.g. trainer), built from its parent with the "
                      "parent's setup.py or a generated one; or a folder holding setup.py "
                      "(default: this project's source tree)."),
    click.option("--packages", "packages", multiple=True,
                 help="Comma-separated sdists (.tar.gz) or wheels (.whl), paths or URLs, "
                      "staged and installed with the package."),
    click.option("--module-name", help="Module each replica runs (default trainer.task)."),
    click.option("--worker-count", type=int, help="Workers (CUSTOM tier only)."),
    click.option("--parameter-server-count", type=int, help="Parameter servers (CUSTOM only)."),
    click.option("--evaluator-count", type=int, help="Evaluators (CUSTOM tier only)."),
    click.option("--stream-logs/--async", "stream_logs", default=True,
                 help="Follow the job's logs until it ends (default), or return at once."),
    click.option("--dry-run", is_flag=True,
                 help="Print the resolved plan as JSON; run, stage and record nothing. To "
                      "show the package's URL and hash it builds the sdist (runs your "
                      "setup.py sdist in a temporary copy); give built archives "
                      "(--packages, or packageUris in --config) to run none."),
    click.option("--resume", is_flag=True, help="Reuse a job id already used in the job dir."),
    click.option("--restart-policy", default=None, metavar="POLICY",
                 help="Never, OnFailure, ExitCode or Always (any case, '-' or '_'): when a "
                      "replica that exits is started again, for every replica type "
                      "[default: each type's restartPolicy in --config, else Never]."),
    click.option("--max-restarts", default=None, type=int,
                 help="Restarts allowed per replica [default: each type's maxRestarts in "
                      f"--config, else {specs.DEFAULT_MAX_RESTARTS} with a restart policy, "
                      "0 without]."),
    click.option("--labels", multiple=True, metavar="KEY=VALUE,...",
                 help="Labels for the job, added to (and overriding) the config's labels."),
    click.option("--master-machine-type", help="The master's machine (CUSTOM tier), e.g. "
                                               "n1-standard-4 or standard."),
    click.option("--worker-machine-type", help="The workers' machine (CUSTOM tier)."),
    click.option("--parameter-server-machine-type", help="The parameter servers' machine "
                                                         "(CUSTOM tier)."),
    click.option("--master-accelerator", metavar="count=N,type=TYPE",
                 help="GPUs per master (CUSTOM tier), e.g. count=1,type=nvidia-tesla-t4."),
    click.option("--worker-accelerator", metavar="count=N,type=TYPE",
                 help="GPUs per worker (CUSTOM tier)."),
    click.option("--parameter-server-accelerator", metavar="count=N,type=TYPE",
                 help="GPUs per parameter server (CUSTOM tier)."),
    click.option("--master-image-uri", metavar="IMAGE",
                 help="A custom container for the master (and, unless they have their "
                      "own, every replica), as Cloud ML's masterConfig.imageUri; the local "
                      "runner runs it with podman or docker."),
    click.option("--worker-image-uri", metavar="IMAGE",
                 help="The workers' container (workerConfig.imageUri)."),
    click.option("--parameter-server-image-uri", metavar="IMAGE",
                 help="The parameter servers' container (parameterServerConfig.imageUri)."),
    click.option("--use-chief-in-tf-config/--no-use-chief-in-tf-config", default=None,
                 help="Name the chief `chief` in TF_CONFIG, not `master` [default: the "
                      "config's useChiefInTfConfig, else by runtimeVersion: master before "
                      "2.1]."),
    click.option("--region", help="The region, recorded in trainingInput; vertex runs the "
                                  "job there [default: the config's region, else us-central1]."),
    click.option("--runtime-version", help="Cloud ML's runtime version (e.g. 2.11), recorded "
                                           "in trainingInput."),
    click.option("--python-version", help="Cloud ML's Python version (e.g. 3.7), recorded in "
                                          "trainingInput."),
]


@cli.command("submit", cls=TrainingCommand, hidden=True)
@click.argument("job_id")
@training_options
@click.pass_context
def submit_command(ctx, job_id, **flags):
    """Submit training job JOB_ID (the short form `python -m submit JOB_ID` means this);
    everything after `--` goes to the trainer, followed by `--job-dir URL` as Cloud ML
    passes it."""
    return submit_training(ctx, job_id, **flags)


@click.command("training", cls=TrainingCommand)
@click.argument("job_id")
@training_options
@click.pass_context
def training_command(ctx, job_id, **flags):
    """Submit training job JOB_ID, as `gcloud ai-platform jobs submit training`;
    everything after `--` goes to the trainer, followed by `--job-dir URL` as Cloud ML
    passes it."""
    return submit_training(ctx, job_id, **flags)


def submit_training(ctx, job_id, stream_logs, config_path, **flags):
    """The submission the flags ask for, run to its end (or its dry run's print): the
    Python API's (submit.api.run_submission), printing what it says."""
    return api.run_submission(job_id, echo=echo, stream=stream_logs, config=config_path,
                              args=ctx.meta["trainer_args"], **flags)
