"""`--runner local`'s own options, declared (`RunOpt`): custom containers' engine, and a
package's image built here (`submit.runners.local_image`)."""
from __future__ import annotations

from submit.runners.engine import RunOpt

RUNOPTS = (
    RunOpt("container_engine", "podman or docker (or a path to either) for custom "
                               "containers [default: $MLJOB_CONTAINER_ENGINE, else podman, "
                               "else docker]", metavar="ENGINE"),
    RunOpt("build_image", "build the package (--package-path, else this project) into "
                          "image NAME here, from the Kubeflow runner's Dockerfile, and run "
                          "every replica in it", metavar="NAME"),
    RunOpt("base_image", "with --build-image, the image the package is installed on "
                         "[default: localhost/mljob-base, made here from Debian's packages]",
           metavar="IMAGE"),
)
