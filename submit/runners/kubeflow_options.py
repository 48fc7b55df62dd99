"""The engine flags of `--runner kubeflow` beyond the shared ones (`EngineOptions`):
which Kubernetes API the job is rendered as, and the Kueue queue it waits in. A plain
dataclass with no cluster client, so the CLI can build it without the kubernetes
package."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

from submit.runners.engine import EngineOptions

APIS = ("tfjob", "jobset")  # the first is the default


@dataclasses.dataclass(frozen=True)
class KubeflowOptions(EngineOptions):
    """`api`: `tfjob` (Kubeflow training-operator's TFJob, the default) or `jobset`
    (kubernetes-sigs/jobset). `queue`: a Kueue LocalQueue (the label
    `kueue.x-k8s.io/queue-name`); over config.yaml's `scheduling.queueName`."""

    api: str | None = None
    queue: str | None = None

    OWNERS: ClassVar[Mapping[str, tuple[str, ...]]] = {
        **EngineOptions.OWNERS, "api": ("kubeflow",), "queue": ("kubeflow",)}
