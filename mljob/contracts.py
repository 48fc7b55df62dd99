"""The wire contracts between mljob's processes and the tools our users know, each kept
once: the replica labels Cloud ML wrote in its logs and their task types and Vertex AI
pools, the progress line a replica prints and the launcher reads (writer and parser side
by side), the marker files a reader waits for, and the environment variables each side
sets or reads, and the role names TF_CONFIG uses. Exit statuses live with the errors
(`mljob.errors`). No TensorFlow here, nor anything else of mljob's.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

# --- roles: TF_CONFIG's task types -------------------------------------------------------
CHIEF, WORKER, PS, EVALUATOR = "chief", "worker", "ps", "evaluator"
MASTER = "master"  # legacy name of chief (Cloud ML before runtime 2.1)
ROLES = (CHIEF, MASTER, WORKER, PS, EVALUATOR)
# The order a job's replicas are stopped in (cancel, deadline, a failure, an early-stopped
# trial): the chief first, while the ps still serve, so it can save its newest steps; then
# workers and evaluators; the ps last. Stopped all at once, a chief under ps lost the steps
# since its last checkpoint (`ps-replica-0 stopped answering`, exit 200).
STOP_ORDER = ((CHIEF, MASTER), (WORKER, EVALUATOR), (PS,))
# What TensorFlow prints on stderr when it loads, whatever TF_CPP_MIN_LOG_LEVEL says (it
# logs before absl is initialised): absl's header and oneDNN's notice, on CPUs where
# TensorFlow turns oneDNN on. The launcher drops them from replicas' logs; the commands
# that import TensorFlow drop them from their own stderr (mljob.startup).
TF_STARTUP_NOISE = re.compile(
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
    r"STDERR$|^I[0-9]{4} [0-9:.]+\s+[0-9]+ port\.cc:[0-9]+\] oneDNN custom operations are on\.")

# --- replica labels: `master-replica-0`, `worker-replica-3` (Cloud ML's log labels) -----
LABEL_KINDS = {CHIEF: "master", MASTER: "master", WORKER: "worker", PS: "ps",
               EVALUATOR: "evaluator"}
VERTEX_POOL_TYPES = (CHIEF, WORKER, PS, EVALUATOR)  # workerPoolSpecs[0..3]
_LABEL = re.compile(r"(master|worker|ps|evaluator)-replica-([0-9]{1,6})")
LABEL_HINT = "master-replica-0, worker-replica-N, ps-replica-N or evaluator-replica-N"


def replica_label(task_type: str, index: int | str) -> str:
    """`chief`, 0 -> `master-replica-0`: Cloud ML called its chief master in labels."""
    return f"{LABEL_KINDS[task_type]}-replica-{index}"


def parse_label(label: str) -> tuple[str, int] | None:
    """`worker-replica-3` -> ("worker", 3) (the chief as `chief`); None for anything else."""
    match = _LABEL.fullmatch(label)
    if not match:
        return None
    kind = CHIEF if match[1] == "master" else match[1]
    return kind, int(match[2])


def vertex_pool(task_type: str) -> int:
    """The Vertex AI worker pool a task type runs in (0 chief, 1 worker, 2 ps, 3 eval)."""
    return VERTEX_POOL_TYPES.index(CHIEF if task_type == MASTER else task_type)


# --- the progress line: `step 120/2000 loss=0.4412 accuracy=0.8700 examples/s=... lr=...`
class Progress(NamedTuple):
    step: int
    total: int
    loss: float


# The loss is optional (a GAN's logs have none); the examples/s every line ends with is not.
_PROGRESS = re.compile(r"^step ([0-9]+)/([0-9]+)\b(?=.*\bexamples/s=|.*\bloss=)"
                       r"(?:.*?\bloss=([-+0-9.eEnaif]+))?")


def progress_line(step: int, total: int, loss: float | None,
                  accuracy: float | Mapping[str, float], examples_per_sec: float,
                  lr: float | Mapping[str, float]) -> str:
    """What a training replica prints every few steps; `parse_progress` reads it back.
    `accuracy` is the accuracy, or the model's metrics by name (printed in order). loss
    None: the model's logs have none (a GAN's `d_loss`, `g_loss` are its metrics). lr:
    the rate, or each optimizer's by name (`d_optimizer_lr`)."""
    rates = f"lr={lr:g}" if not isinstance(lr, Mapping) else \
        " ".join(f"{name}={value:g}" for name, value in lr.items())
    return " ".join(filter(None, (f"step {step}/{total}",
                                  "" if loss is None else f"loss={loss:.4f}",
                                  _metrics_text(accuracy),
                                  f"examples/s={examples_per_sec:.1f} {rates}")))


def eval_line(step: int, loss: float | None, accuracy: float | Mapping[str, float]) -> str:
    shown = "" if loss is None else f" loss={loss:.4f}"
    return f"eval step={step}{shown} {_metrics_text(accuracy)}".rstrip()


def _metrics_text(metrics: float | Mapping[str, float]) -> str:
    if not isinstance(metrics, Mapping):
        metrics = {"accuracy": metrics}
    return " ".join(f"{name}={value:.4f}" for name, value in metrics.items())


def parse_progress(text: str) -> Progress | None:
    match = _PROGRESS.match(text)
    if not match:
        return None
    try:
        return Progress(int(match[1]), int(match[2]),
                        float(match[3]) if match[3] is not None else float("nan"))
    except ValueError:
        return None


# --- markers: the file written last when a folder is published; readers wait for it ----
SAVED_MODEL_MARKER = "saved_model.pb"
LEGACY_EXPORT_MARKER = "export.meta"    # TF1 meta graph exports
CHECKPOINT_STATE = "checkpoint"         # TensorFlow's checkpoint state file
PUBLISH_MARKERS = (CHECKPOINT_STATE, SAVED_MODEL_MARKER)

# --- environment variables ---------------------------------------------------------------
TF_CONFIG = "TF_CONFIG"
CLUSTER_SPEC = "CLUSTER_SPEC"            # Vertex AI's worker pools
JOB_ID_ENV = "CLOUD_ML_JOB_ID"           # Cloud ML's, set by the local runner and Kubeflow
MLJOB_JOB_ID_ENV = "MLJOB_JOB_ID"        # on Vertex AI, which sets CLOUD_ML_JOB_ID itself
PARENT_PID_ENV = "MLJOB_PARENT_PID"      # the supervising process a replica dies with
# A replica asked to stop that has not exited this many seconds later ends itself
# (mljob.training.signals); launchers give a stopping chief this long to save.
STOP_DEADLINE_ENV = "MLJOB_STOP_DEADLINE"
STOP_DEADLINE_SECONDS = 60.0
AIP_MODEL_DIR, AIP_CHECKPOINT_DIR, AIP_TENSORBOARD_LOG_DIR = (
    "AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR")
AIP_DIRS = (AIP_MODEL_DIR, AIP_CHECKPOINT_DIR, AIP_TENSORBOARD_LOG_DIR)
# Set by an engine where `submit` itself may run: a local job's replicas never inherit them.
ENGINE_VARIABLES = (CLUSTER_SPEC, *AIP_DIRS)
# Hyperparameter tuning (Cloud ML's and the cloudml-hypertune library's names).
TRIAL_ID_ENV = "CLOUD_ML_TRIAL_ID"
HP_METRIC_TAG_ENV = "CLOUD_ML_HP_METRIC_TAG"
HP_METRIC_FILE_ENV = "CLOUD_ML_HP_METRIC_FILE"
DEFAULT_HP_METRIC_TAG = "training/hptuning/metric"
DEFAULT_HP_METRIC_FILE = "/tmp/hypertune/output.metrics"
