"""A package's image, built here: its sdist, built as a job stages it, installed by the
Dockerfile the Kubeflow runner writes (`submit.runners.kubeflow_render`) on a base image
(`submit.local.image_build`). Used where an image is wanted from a package folder: the
tests' containers, and users without a registry (docs/engines.md)."""
from __future__ import annotations

import shutil
import tempfile

from mljob.fitting import LAUNCHER
from submit.local import container_engine as ce
from submit.local import image_build
from submit.packaging import package as packages
from submit.runners.kubeflow_render import build_context


def package_image(engine: ce.Engine, source: str | None, name: str | None, base: str | None,
                  *, module: str | None = None, log=print) -> str:
    """The image of a package folder (`--package-path`; None: this project, its bundled
    trainer): its sdist, built as a job stages it, installed by the Kubeflow runner's
    Dockerfile on `base`, with `python -m mljob.fitting.launch MODULE` as its entrypoint
    when a module is given (as Vertex's local-run images have it; the Kubeflow
    Dockerfile has none: its pods name the command). Unnamed, it is
    `localhost/<dist name>:<sdist hash>`, and found already built when that hash was
    built before."""
    out_dir = tempfile.mkdtemp(prefix="sdist-")
    try:
        package = packages.build(packages.resolve_source(source), out_dir)
        if name is None:
            name = f"localhost/{package.dist_name}:{package.sha256[:12]}"
            if ce.image_exists(engine, name):
                return name
        image_build.build_job_image(engine, build_context(package, gpu=False), name, base,
                                    log=log)
        if module is not None:
            image_build.set_entrypoint(engine, name, ["python", "-m", LAUNCHER, module])
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    return name
