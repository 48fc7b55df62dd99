"""`--runner ray`'s own options, declared (`RunOpt`) without Ray."""
from __future__ import annotations

from submit.runners.engine import RunOpt

RUNOPTS = (
    RunOpt("ray_address", "the Ray cluster's dashboard (job API) address, e.g. "
                          "http://HEAD:8265 [default: $RAY_ADDRESS]", metavar="URL"),
)
