"""`--runner vertex`'s own options, declared (`RunOpt`) without the Vertex SDK."""
from __future__ import annotations

from submit.runners.engine import RunOpt

RUNOPTS = (
    RunOpt("image", "the executor image the package is installed into",
           prediction="the prediction container for --model-dir [default: Vertex's "
                      "prebuilt TensorFlow image]"),
    RunOpt("project", "the Google Cloud project [default: $GOOGLE_CLOUD_PROJECT]",
           prediction="the Google Cloud project [default: $GOOGLE_CLOUD_PROJECT]"),
    RunOpt("service_account", "the service account email replicas run as"),
)
