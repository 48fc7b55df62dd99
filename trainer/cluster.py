"""The cluster this replica belongs to, parsed once from TF_CONFIG or the seeds' flags.

Everything TensorFlow needs to know about the cluster comes from `ClusterInfo`; no other
module reads TF_CONFIG. Parsing imports nothing from TensorFlow, so a malformed cluster is
reported (exit status 2) before any server starts.

Accepted shapes:
- TF_CONFIG as Cloud ML (runtime 2.1+), `gcloud ai-platform local train` and Kubeflow's
  TFJob set it: `{"cluster": {...}, "task": {"type": ..., "index": ...}, ...}`, with
  `environment`, `job`, `trial` and `cloud` tolerated. `master` is the legacy name of
  `chief` and is renamed, since TensorFlow's ParameterServerStrategy refuses it.
- The seeds' flags: `--ps-hosts`, `--worker-hosts`, `--job-name`, `--task-index`;
  worker 0 is then the chief.
- Neither (or a cluster holding only the chief): a single-node run.

An evaluator listed inside `cluster` (some Kubeflow versions do that) is left out of the
training cluster: TensorFlow's strategies hang when it is there.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Mapping

CHIEF, WORKER, PS, EVALUATOR = "chief", "worker", "ps", "evaluator"
MASTER = "master"  # legacy name of chief (Cloud ML before runtime 2.1)
ROLES = (CHIEF, MASTER, WORKER, PS, EVALUATOR)
TRAINING_JOBS = (CHIEF, WORKER, PS)
TOLERATED_KEYS = ("cluster", "task", "environment", "job", "trial", "cloud", "rpc_layer")
STRATEGIES = ("auto", "ps", "multiworker", "mirrored", "single")

_ADDRESS = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.\-]+):(\d{1,5})$")


class ClusterConfigError(ValueError):
    """The cluster description is malformed; the message names the problem and the fix."""


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """This replica's place in the job.

    `cluster` is the training cluster as TensorFlow must see it: jobs `chief`, `worker`
    and `ps` only (master renamed, evaluators removed), each a tuple of host:port.
    `task_type` is one of chief, worker, ps, evaluator; `legacy_master` records that the
    job called its chief `master`, so logs and labels can keep the user's name.
    """

    task_type: str = CHIEF
    task_index: int = 0
    cluster: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    legacy_master: bool = False
    environment: str | None = None
    trial: str | None = None

    @property
    def is_chief(self) -> bool:
        """The chief writes checkpoints, summaries and the export; with no chief job
        (MultiWorkerMirroredStrategy as some engines set it up) worker 0 leads."""
        if self.task_type == CHIEF:
            return True
        return (self.task_type == WORKER and self.task_index == 0
                and not self.cluster.get(CHIEF))

    @property
    def is_evaluator(self) -> bool:
        return self.task_type == EVALUATOR

    @property
    def num_workers(self) -> int:
        return len(self.cluster.get(WORKER, ()))

    @property
    def num_ps(self) -> int:
        return len(self.cluster.get(PS, ()))

    @property
    def is_single_node(self) -> bool:
        """True when there is nobody to train with: no workers and no ps."""
        return self.num_workers == 0 and self.num_ps == 0

    @property
    def task_name(self) -> str:
        """The replica's label as Cloud ML writes it in logs: master-replica-0, ps-replica-1."""
        kind = MASTER if (self.is_chief and self.legacy_master) else self.task_type
        return f"{kind}-replica-{self.task_index}"

    @property
    def address(self) -> str | None:
        hosts = self.cluster.get(self.task_type, ())
        return hosts[self.task_index] if self.task_index < len(hosts) else None

    def tf_config(self) -> dict:
        """TF_CONFIG as TensorFlow's resolvers accept it (no master, no evaluator in cluster)."""
        return {
            "cluster": {job: list(hosts) for job, hosts in self.cluster.items() if hosts},
            "task": {"type": self.task_type, "index": self.task_index},
        }

    def strategy_kind(self, requested: str = "auto", num_gpus: int = 0) -> str:
        """Resolve `--strategy` against the cluster: ps, multiworker, mirrored or single.

        The evaluator never trains; it gets `single`.
        """
        if requested not in STRATEGIES:
            raise ClusterConfigError(
                f"unknown --strategy {requested!r}; use one of {', '.join(STRATEGIES)}")
        if self.is_evaluator:
            return "single"
        if requested == "auto":
            if self.num_ps:
                return "ps"
            if self.num_workers:
                return "multiworker"
            return "mirrored" if num_gpus > 1 else "single"
        if requested == "ps" and not self.num_ps:
            raise ClusterConfigError(
                "--strategy ps needs parameter servers, and the cluster has none; "
                "add a 'ps' job to TF_CONFIG or use --strategy auto")
        if requested == "multiworker" and self.num_ps:
            raise ClusterConfigError(
                "--strategy multiworker cannot use the cluster's parameter servers; "
                "remove the 'ps' job from TF_CONFIG or use --strategy ps")
        if requested == "multiworker" and not self.num_workers:
            raise ClusterConfigError(
                "--strategy multiworker needs workers besides the chief, and the cluster "
                "has none; add a 'worker' job to TF_CONFIG or use --strategy single")
        if requested in ("single", "mirrored") and not self.is_single_node:
            raise ClusterConfigError(
                f"--strategy {requested} runs on one node, but TF_CONFIG describes a "
                f"cluster of {self.describe()}; unset TF_CONFIG or use --strategy auto")
        if requested == "mirrored" and num_gpus < 2:
            raise ClusterConfigError(
                f"--strategy mirrored needs several local GPUs, and {num_gpus} is visible; "
                "use --strategy single")
        return requested

    def describe(self) -> str:
        parts = [f"{len(self.cluster.get(job, ()))} {job}" for job in TRAINING_JOBS
                 if self.cluster.get(job)]
        return ", ".join(parts) or "one node"


def parse_tf_config(text: str | None) -> ClusterInfo:
    """Parse TF_CONFIG's text; None or blank means a single-node run."""
    if text is None or not text.strip():
        return ClusterInfo()
    try:
        config = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ClusterConfigError(
            f"TF_CONFIG is not valid JSON ({_short(exc)}); set it to an object like "
            '{"cluster": {"chief": ["host:2222"]}, "task": {"type": "chief", "index": 0}}'
        ) from None
    if not isinstance(config, dict):
        raise ClusterConfigError(
            f"TF_CONFIG must be a JSON object, not {type(config).__name__}; set it to an "
            'object like {"cluster": {...}, "task": {"type": "chief", "index": 0}}')
    unknown = sorted(set(config) - set(TOLERATED_KEYS))
    if unknown:
        raise ClusterConfigError(
            f"TF_CONFIG has unknown key {unknown[0]!r}; allowed keys are "
            f"{', '.join(TOLERATED_KEYS)}")
    cluster = config.get("cluster") or {}
    task = config.get("task") or {}
    if not isinstance(cluster, dict):
        raise ClusterConfigError(
            "TF_CONFIG 'cluster' must be an object mapping job names to lists of host:port")
    if not isinstance(task, dict):
        raise ClusterConfigError(
            'TF_CONFIG \'task\' must be an object like {"type": "worker", "index": 0}')
    environment = config.get("environment")
    trial = task.get("trial", config.get("trial"))
    return _build(cluster, task, source="TF_CONFIG",
                  environment=environment if isinstance(environment, str) else None,
                  trial=None if trial is None else str(trial))


def parse_flags(ps_hosts: str | None, worker_hosts: str | None, job_name: str | None,
                task_index: int | None) -> ClusterInfo:
    """The seeds' form: --ps-hosts/--worker-hosts/--job-name/--task-index; worker 0 is chief."""
    if not worker_hosts:
        raise ClusterConfigError(
            "--worker-hosts is required with --ps-hosts/--job-name/--task-index; "
            "give it as host:port,host:port (worker 0 is the chief)")
    workers = _split_hosts(worker_hosts, "--worker-hosts")
    ps = _split_hosts(ps_hosts, "--ps-hosts") if ps_hosts else []
    if job_name not in (WORKER, PS):
        raise ClusterConfigError(
            f"--job-name must be 'worker' or 'ps', not {job_name!r}")
    index = 0 if task_index is None else task_index
    cluster = {CHIEF: workers[:1], WORKER: workers[1:], PS: ps}
    if job_name == WORKER:
        if not 0 <= index < len(workers):
            raise ClusterConfigError(
                f"--task-index {index} is out of range for {len(workers)} worker host(s); "
                f"use 0 to {len(workers) - 1}")
        task = {"type": CHIEF, "index": 0} if index == 0 else {"type": WORKER, "index": index - 1}
    else:
        task = {"type": PS, "index": index}
    return _build(cluster, task, source="--ps-hosts/--worker-hosts")


def from_environment(environ: Mapping[str, str], *, ps_hosts=None, worker_hosts=None,
                     job_name=None, task_index=None) -> ClusterInfo:
    """The one entry point: flags when given, else TF_CONFIG, else a single node."""
    flags_given = any(v is not None for v in (ps_hosts, worker_hosts, job_name, task_index))
    if flags_given and environ.get("TF_CONFIG", "").strip():
        raise ClusterConfigError(
            "both TF_CONFIG and --ps-hosts/--worker-hosts describe the cluster; "
            "unset TF_CONFIG or drop the flags")
    if flags_given:
        return parse_flags(ps_hosts, worker_hosts, job_name, task_index)
    return parse_tf_config(environ.get("TF_CONFIG"))


def _build(cluster: dict, task: dict, *, source: str, environment: str | None = None,
           trial: str | None = None) -> ClusterInfo:
    for job in cluster:
        if job not in ROLES:
            raise ClusterConfigError(
                f"{source} cluster has unknown job {job!r}; allowed jobs are "
                f"{', '.join(ROLES)}")
    if cluster.get(CHIEF) and cluster.get(MASTER):
        raise ClusterConfigError(
            f"{source} cluster has both 'chief' and 'master'; master is the legacy name "
            "of chief, keep only one")
    hosts: dict[str, list[str]] = {}
    for job, value in cluster.items():
        if isinstance(value, dict):  # TF also allows {index: address} for sparse jobs
            value = [value[k] for k in sorted(value, key=lambda k: int(k))] \
                if all(str(k).isdigit() for k in value) else None
        if not isinstance(value, list) or not all(isinstance(h, str) for h in value):
            raise ClusterConfigError(
                f"{source} cluster job {job!r} must be a list of 'host:port' strings")
        for address in value:
            _check_address(address, f"{source} cluster job {job!r}")
        hosts[job] = value
    legacy_master = MASTER in hosts and bool(hosts[MASTER])
    if legacy_master:
        hosts[CHIEF] = hosts.pop(MASTER)
    hosts.pop(MASTER, None)
    if len(hosts.get(CHIEF, [])) > 1:
        raise ClusterConfigError(
            f"{source} cluster has {len(hosts[CHIEF])} chiefs; a job has exactly one "
            "chief (or master)")
    evaluators = hosts.pop(EVALUATOR, [])
    seen: dict[str, str] = {}
    for job, addresses in hosts.items():
        for i, address in enumerate(addresses):
            where = f"{job} {i}"
            if address in seen:
                raise ClusterConfigError(
                    f"{source} cluster gives address {address} to both {seen[address]} "
                    f"and {where}; every task needs its own host:port")
            seen[address] = where

    task_type = task.get("type")
    task_index = task.get("index", 0)
    if task_type is None and not task:
        task_type = CHIEF if hosts.get(CHIEF) or not hosts else None
        if task_type is None:
            raise ClusterConfigError(
                f"{source} has a cluster but no task; add "
                '"task": {"type": "worker", "index": 0} naming this replica')
    if not isinstance(task_type, str) or task_type not in ROLES:
        raise ClusterConfigError(
            f"{source} task type {task_type!r} is unknown; use one of {', '.join(ROLES)}")
    if task_type == MASTER:
        task_type = CHIEF
        legacy_master = True
    if isinstance(task_index, str) and task_index.isdigit():
        task_index = int(task_index)
    if isinstance(task_index, bool) or not isinstance(task_index, int):
        raise ClusterConfigError(
            f"{source} task index {task_index!r} must be a non-negative integer")
    if task_index < 0:
        raise ClusterConfigError(
            f"{source} task index {task_index} is negative; indexes start at 0")

    if task_type == EVALUATOR:
        if evaluators and task_index >= len(evaluators):
            raise ClusterConfigError(
                f"{source} task index {task_index} is out of range for "
                f"{len(evaluators)} evaluator(s)")
    elif hosts:
        members = hosts.get(task_type, [])
        if not members:
            raise ClusterConfigError(
                f"{source} task is {task_type} {task_index}, but the cluster has no "
                f"{task_type!r} job; add it to the cluster or fix the task type")
        if task_index >= len(members):
            raise ClusterConfigError(
                f"{source} task index {task_index} is out of range for {len(members)} "
                f"{task_type}(s); use 0 to {len(members) - 1}")
    elif task_type != CHIEF or task_index != 0:
        raise ClusterConfigError(
            f"{source} task is {task_type} {task_index}, but the cluster is empty; "
            "list the cluster's hosts, or unset TF_CONFIG for a single-node run")

    if hosts.get(PS) and not hosts.get(WORKER):
        raise ClusterConfigError(
            f"{source} cluster has parameter servers but no worker; a ps-strategy job "
            "needs at least one worker to train")
    if hosts.get(PS) and not hosts.get(CHIEF):
        raise ClusterConfigError(
            f"{source} cluster has parameter servers but no chief to coordinate them; "
            "add a 'chief' (or 'master') job")
    cluster_out = {job: tuple(hosts[job]) for job in TRAINING_JOBS if hosts.get(job)}
    return ClusterInfo(task_type=task_type, task_index=task_index, cluster=cluster_out,
                       legacy_master=legacy_master, environment=environment, trial=trial)


def _check_address(address: str, where: str) -> None:
    match = _ADDRESS.match(address)
    if not match or not 0 < int(match.group(2)) < 65536:
        raise ClusterConfigError(
            f"{where} has bad address {address!r}; write it as host:port with a port "
            "from 1 to 65535")


def _split_hosts(value: str, flag: str) -> list[str]:
    hosts = [h.strip() for h in value.split(",") if h.strip()]
    for address in hosts:
        _check_address(address, flag)
    return hosts


def _short(exc: Exception) -> str:
    return str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
