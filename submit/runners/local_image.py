"""`--build-image NAME` (and `--base-image`) of `jobs submit training`: the package built
into an image on this machine, as Vertex's `local-run` builds one, and the job's replicas
run in it by the local runner (docs/engines.md, "Images made here").

The image is the Kubeflow runner's Dockerfile built on the base (`localhost/mljob-base`,
made here when missing, or `--base-image`), with the module as its entrypoint; the job
then runs as with `--master-image-uri NAME`: every replica in it, no package staged."""
from __future__ import annotations

from collections.abc import Callable

from submit.errors import UsageError
from submit.jobdef.containers import FLAGS, check_image
from submit.local import container_engine as ce
from submit.local import image_build
from submit.runners import images

DEFAULT_MODULE = "trainer.task"


def build_for_submit(options, package_path: str | None, module_name: str | None,
                     dry_run: bool, job_definition: dict,
                     log: Callable[[str], None]) -> tuple[None, str]:
    """Build the image (not for a dry run) and make it the job's: the package path, now
    the image's, is spent (None); the module is what the image runs, and what the job's
    record names (`pythonModule`). The options are the local runner's
    (`submit.runners.local_options`; `check_for` refused them elsewhere). `log` gets
    the builds' progress lines (the command line's stderr)."""
    name, base, choice = options.build_image, options.base_image, options.container_engine
    if name is None:
        raise UsageError("--base-image is the base of --build-image; give --build-image "
                         "NAME too, or drop --base-image")
    given = [flag for key, (_, flag) in FLAGS.items() if job_definition.get(key)]
    if given:
        raise UsageError(f"--build-image names every replica's image; drop {given[0]}")
    check_image(name, "--build-image", UsageError)
    if base is not None:
        check_image(base, "--base-image", UsageError)
    module = module_name or DEFAULT_MODULE
    if not dry_run:
        engine = ce.detect(choice)
        base = base or image_build.base_image(engine, log=log)
        images.package_image(engine, package_path, name, base, module=module, log=log)
    job_definition["master_image_uri"] = name
    return None, module
