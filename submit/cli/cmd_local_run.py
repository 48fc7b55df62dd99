"""`local-run`, as Vertex's `gcloud ai custom-jobs local-run`: the training code in a
folder packed into an image on the executor image, and run in a container here.

    python -m submit local-run --executor-image-uri BASE --python-module M \\
        [--local-package-path DIR] [--requirements R,...] [--output-image-uri NAME] \\
        [-- ARGS]

Vertex's flags, mapped onto what `--build-image` does (docs/engines.md, "Images made
here"): `--executor-image-uri` is the base (in the engine's local images: nothing is
pulled), `--local-package-path` the folder (default: the current one; a folder with
setup.py or pyproject.toml is built as that project, else the module's top package is),
`--python-module` the image's entrypoint (`python -m M`), `--requirements` and the
folder's requirements.txt pip-installed in the image, `--output-image-uri` its name
(default `localhost/<dist name>:<hash>`). One container runs (Vertex's local-run runs
one replica), as a job of the local runner (`local_run_<time>_<pid>`, its logs
followed, its exit status this command's). The flags the local runner has no way to
honour are refused, each in one line naming what to use instead.
"""
from __future__ import annotations

import os
import time

import click

from submit import api
from submit.cli.cli_base import TrainerArgsCommand, cli, echo
from submit.errors import UsageError
from submit.jobdef.containers import check_image

# Vertex's flags this command does not take, and what to use instead.
REFUSED = {
    "--script": "give the module with --python-module (a script runs as `python -m` of "
                "its package)",
    "--extra-packages": "list them in --requirements, or in the package's setup.py",
    "--extra-dirs": "put the files in the package (package_data), or pass their URL as "
                    "an argument",
    "--gpu": "GPUs come from acceleratorConfig: submit with --build-image and --config",
    "--service-account-key-file": "the container gets no credentials from here; set "
                                  "them in the image",
    "--worker-pool-spec": "that is `custom-jobs create`'s: submit with --build-image NAME "
                          "and a config.yaml of the replicas (or --scale-tier)",
}


# Vertex's local-run flags given to another command (`python -m submit JOB ...`): what
# the job submission takes instead.
SUBMIT_SPELLING = {
    "--executor-image-uri": "--base-image IMAGE (with --build-image NAME)",
    "--local-package-path": "--package-path DIR (with --build-image NAME)",
    "--python-module": "--module-name MODULE",
    "--requirements": "the package's setup.py install_requires (with --build-image NAME)",
    "--output-image-uri": "--build-image NAME",
    "--worker-pool-spec": "--config FILE (the replicas' trainingInput) or --scale-tier",
}


def elsewhere(option: str | None) -> str | None:
    """The one line for a Vertex local-run flag given to another command, else None."""
    if option not in SUBMIT_SPELLING:
        return None
    return (f"{option} is Vertex's (gcloud ai custom-jobs): run `python -m submit "
            f"local-run {option} ...` as Vertex's local-run, or submit the job with "
            f"{SUBMIT_SPELLING[option]}")


def _refuse(ctx, param, value):
    if value:
        raise UsageError(f"{param.opts[0]} is not taken by local-run here: "
                         f"{REFUSED[param.opts[0]]}")
    return value


def _refused_options(command):
    for flag in reversed(REFUSED):
        is_flag = flag == "--gpu"
        command = click.option(flag, f"refused_{flag[2:].replace('-', '_')}",
                               is_flag=is_flag, default=None if not is_flag else False,
                               expose_value=False, callback=_refuse, hidden=True)(command)
    return command


@cli.command("local-run", cls=TrainerArgsCommand)
@click.option("--executor-image-uri", required=True, metavar="IMAGE",
              help="The base image: Python, pip and TensorFlow (e.g. localhost/mljob-base:"
                   "TAG), in the engine's local images.")
@click.option("--local-package-path", type=click.Path(file_okay=False), default=".",
              show_default=True, help="The folder holding the training code.")
@click.option("--python-module", required=True, metavar="MODULE",
              help="The module the container runs (`python -m MODULE`).")
@click.option("--requirements", multiple=True, metavar="REQ[,REQ...]",
              help="pip requirements installed in the image.")
@click.option("--output-image-uri", metavar="NAME",
              help="The image's name (default localhost/<package>:<hash>).")
@click.option("--container-engine", metavar="ENGINE",
              help="podman, docker or a path to either (default: "
                   "$MLJOB_CONTAINER_ENGINE, else podman, else docker).")
@_refused_options
@click.pass_context
def local_run(ctx, executor_image_uri, local_package_path, python_module, requirements,
              output_image_uri, container_engine):
    """Build an image of the training code on the executor image and run it here in one
    container, as `gcloud ai custom-jobs local-run`. Arguments for the module follow
    `--`."""
    from submit.local import container_engine as ce
    from submit.runners import images
    check_image(executor_image_uri, "--executor-image-uri", UsageError)
    if output_image_uri is not None:
        check_image(output_image_uri, "--output-image-uri", UsageError)
    reqs = [r.strip() for given in requirements for r in given.split(",") if r.strip()]
    source = source_folder(local_package_path, python_module)
    engine = ce.detect(container_engine)
    if not ce.image_exists(engine, executor_image_uri):
        raise UsageError(f"--executor-image-uri {executor_image_uri} is not in "
                         f"{engine.kind}'s local images (nothing is pulled here): build "
                         "one (python -m submit JOB --build-image NAME builds "
                         "localhost/mljob-base) or load it first")
    requirements_txt = os.path.join(local_package_path, "requirements.txt")
    log = lambda text: echo(text, err=True)  # noqa: E731
    name = images.package_image(
        engine, source, output_image_uri, executor_image_uri, module=python_module,
        requirements=reqs, requirements_file=requirements_txt
        if os.path.isfile(requirements_txt) else None, log=log)
    echo(f"image {name} built on {executor_image_uri}; running {python_module} in it",
         err=True)
    job_id = "local_run_" + time.strftime("%Y%m%d_%H%M%S") + f"_{os.getpid()}"
    return api.run_submission(job_id, echo=echo, stream=True, scale_tier="BASIC",
                              master_image_uri=name, module_name=python_module,
                              container_engine=container_engine,
                              args=ctx.meta.get("trainer_args") or ())


def source_folder(path: str, module: str) -> str:
    """What is built into the image: the folder when it is a project (setup.py or
    pyproject.toml), else the module's top package in it (gcloud's work dir holds
    the package; mljob builds packages, not folders)."""
    if not os.path.isdir(path):
        raise UsageError(f"--local-package-path {path} is not a folder; give the folder "
                         "holding the training code")
    if any(os.path.isfile(os.path.join(path, f)) for f in ("setup.py", "pyproject.toml")):
        return path
    top = os.path.join(path, module.split(".")[0])
    if not os.path.isdir(top):
        raise UsageError(f"--python-module {module}: {module.split('.')[0]}/ is not in "
                         f"{path}; give the folder that holds the module's package")
    return top
