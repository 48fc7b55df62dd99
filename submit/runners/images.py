"""A package's image, built here: its sdist, built as a job stages it, installed with
mljob's core by the Dockerfile the Kubeflow runner writes (`submit.runners.kubeflow_render`)
on a base image (`submit.local.image_build`). Used where an image is wanted from a
package folder: the tests' containers, and users without a registry (docs/engines.md)."""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile

from mljob.fitting import LAUNCHER
from submit.local import container_engine as ce
from submit.local import image_build
from submit.packaging import package as packages
from submit.packaging.package import Package
from submit.runners.kubeflow_render import build_context


def with_core(package: Package, out_dir: str) -> Package:
    """The package with mljob's core beside it (an sdist of `mljob` alone), as the
    Kubeflow runner installs it: every replica's command runs mljob's launcher, and the
    user's code may import mljob. This project's own sdist (its dist name is mljob)
    holds the core already."""
    if any(p.dist_name == "mljob" for p in package.all):
        return package
    core = packages.build_mljob_core(os.path.join(out_dir, "mljob-core"))
    return dataclasses.replace(package, extras=(*package.extras, core))


def image_key(package: Package) -> str:
    """The hash an unnamed image is tagged with: of every archive it installs."""
    if not package.extras:
        return package.sha256[:12]
    return hashlib.sha256(" ".join(p.sha256 for p in package.all).encode()).hexdigest()[:12]


def package_image(engine: ce.Engine, source: str | None, name: str | None, base: str | None,
                  *, module: str | None = None, requirements: list[str] | None = None,
                  requirements_file: str | None = None, log=print) -> str:
    """The image of a package folder (`--package-path`; None: this project, its bundled
    trainer): its sdist, built as a job stages it, and mljob's core, installed by the
    Kubeflow runner's Dockerfile on `base`, with `python -m mljob.fitting.launch MODULE`
    as its entrypoint when a module is given (as Vertex's local-run images have it; the
    Kubeflow Dockerfile has none: its pods name the command). Unnamed, it is
    `localhost/<dist name>:<hash of its archives>`, and found already built when those
    archives were built before. `requirements` (pip's) and a `requirements_file` are
    installed in a layer of their own (`local-run`'s --requirements)."""
    out_dir = tempfile.mkdtemp(prefix="sdist-")
    try:
        package = with_core(packages.build(packages.resolve_source(source), out_dir),
                            out_dir)
        extra = bool(requirements or requirements_file)
        if name is None:
            name = f"localhost/{package.dist_name}:{image_key(package)}"
            if ce.image_exists(engine, name) and not extra:
                return name
        image_build.build_job_image(engine, build_context(package, gpu=False), name, base,
                                    log=log)
        if module is not None or extra:
            image_build.finish_image(engine, name, ["python", "-m", LAUNCHER, module]
                                     if module else None, requirements or [],
                                     requirements_file)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    return name
