"""The config keys that only cluster engines read, kept apart from `submit.jobdef.spec` (which
merges them in) so that each engine's keys are listed, typed and checked in one place.

trainingInput (Cloud ML's own fields where Cloud ML had them, else Vertex AI's names):
- `serviceAccount` (str): the identity replicas run as; `--service-account` wins.
  Vertex: CustomJobSpec.service_account (an email); kubeflow: the pods'
  serviceAccountName (a Kubernetes name).
- `network` (str): Vertex's VPC peering network, `projects/NUMBER/global/networks/NAME`.
- `enableWebAccess` (bool): Vertex's interactive shell into the replicas.
- `tensorboard` (str): a Vertex TensorBoard resource,
  `projects/P/locations/R/tensorboards/ID`, that the job's logs are uploaded to.
- `baseOutputDirectory` (str): Vertex's base output directory (gs://), where AIP_MODEL_DIR,
  AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR point; default the job dir.

trainingInput.scheduling, beside Cloud ML's maxRunningTime and maxWaitTime:
- `strategy` (str): STANDARD, SPOT or FLEX_START (Vertex's Scheduling.Strategy; on
  GKE the matching node pools, see docs/engines.md).
- `queueName` (str): the Kueue LocalQueue the job waits in (`--queue` wins). Named after
  the field Kueue itself keeps it in (Workload.spec.queueName; the label is
  `kueue.x-k8s.io/queue-name`), and under `scheduling` because it decides when the job
  starts, as maxWaitTime does.
- `ttlAfterFinished` (Duration, `86400s`): how long Kubernetes keeps the finished job
  object before deleting it (`ttlSecondsAfterFinished`).
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from submit.errors import ConfigError

TRAINING_INPUT_KEYS: dict[str, tuple] = {
    "serviceAccount": (str,), "network": (str,), "enableWebAccess": (bool,),
    "tensorboard": (str,), "baseOutputDirectory": (str,)}
SCHEDULING_KEYS = ("strategy", "queueName", "ttlAfterFinished")
STRATEGIES = ("STANDARD", "SPOT", "FLEX_START")
QUEUE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # fullmatch: a DNS label
NETWORK = re.compile(r"projects/[^/\s]+/global/networks/[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
TENSORBOARD = re.compile(r"projects/[^/\s]+/locations/[a-z]+(-[a-z]+)+[0-9]{1,2}/"
                         r"tensorboards/[0-9]{1,20}")
QUEUE_HINT = "lower-case letters, digits and '-', at most 63 (a Kueue LocalQueue name)"


def check(ti: Mapping[str, Any], duration: Callable[[Any, str], float]) -> None:
    """The values of the keys above (their types are checked with trainingInput's)."""
    network = ti.get("network")
    if network is not None and not NETWORK.fullmatch(network):
        raise ConfigError(f"trainingInput.network {network!r:.80} is not a VPC network; "
                          "write projects/PROJECT_NUMBER/global/networks/NAME")
    board = ti.get("tensorboard")
    if board is not None and not TENSORBOARD.fullmatch(board):
        raise ConfigError(f"trainingInput.tensorboard {board!r:.80} is not a Vertex AI "
                          "TensorBoard; write projects/PROJECT/locations/REGION/"
                          "tensorboards/ID")
    base = ti.get("baseOutputDirectory")
    if base is not None and not re.fullmatch(r"gs://[a-z0-9][-_.a-z0-9]{1,221}(/\S*)?",
                                             base):
        raise ConfigError(f"trainingInput.baseOutputDirectory {base!r:.80} is not a "
                          "gs:// URL; write gs://BUCKET/PATH")
    scheduling = ti.get("scheduling") or {}
    strategy = scheduling.get("strategy")
    if strategy is not None and strategy not in STRATEGIES:
        raise ConfigError(f"trainingInput.scheduling.strategy {strategy!r:.60} is not a "
                          f"scheduling strategy; use one of {', '.join(STRATEGIES)}")
    queue = scheduling.get("queueName")
    if queue is not None and not (isinstance(queue, str) and QUEUE_NAME.fullmatch(queue)):
        raise ConfigError(f"trainingInput.scheduling.queueName {queue!r:.80} is not a "
                          f"queue name; use {QUEUE_HINT}")
    if "ttlAfterFinished" in scheduling:
        seconds = duration(scheduling["ttlAfterFinished"],
                           "trainingInput.scheduling.ttlAfterFinished")
        if seconds > 2**31 - 1:
            raise ConfigError("trainingInput.scheduling.ttlAfterFinished is more than "
                              "Kubernetes keeps (2147483647s); give less")


@dataclasses.dataclass(frozen=True)
class EngineKeys:
    """The keys above, resolved once into the JobSpec (`JobSpec.engine`): renderers read
    these fields, never the raw trainingInput. None where the config did not give one."""

    service_account: str | None = None
    network: str | None = None
    enable_web_access: bool | None = None
    tensorboard: str | None = None
    base_output_directory: str | None = None
    strategy: str | None = None
    queue_name: str | None = None
    ttl_seconds: int | None = None

    # field -> the config key a message names
    KEYS: ClassVar[Mapping[str, str]] = {
        "service_account": "serviceAccount", "network": "network",
        "enable_web_access": "enableWebAccess", "tensorboard": "tensorboard",
        "base_output_directory": "baseOutputDirectory",
        "strategy": "scheduling.strategy", "queue_name": "scheduling.queueName",
        "ttl_seconds": "scheduling.ttlAfterFinished"}

    def given(self, *fields: str) -> list[str]:
        """The config keys (as written) of those of `fields` the config gave."""
        return [self.KEYS[f] for f in fields if getattr(self, f) is not None]


def resolve(ti: Mapping[str, Any], duration: Callable[[Any, str], float]) -> EngineKeys:
    """The keys above, checked (`check`) and resolved."""
    check(ti, duration)
    scheduling = ti.get("scheduling") or {}
    ttl = scheduling.get("ttlAfterFinished")
    return EngineKeys(
        service_account=ti.get("serviceAccount"), network=ti.get("network"),
        enable_web_access=ti.get("enableWebAccess"), tensorboard=ti.get("tensorboard"),
        base_output_directory=ti.get("baseOutputDirectory"),
        strategy=scheduling.get("strategy"), queue_name=scheduling.get("queueName"),
        ttl_seconds=None if ttl is None else math.ceil(
            duration(ttl, "trainingInput.scheduling.ttlAfterFinished")))
