"""The cluster this replica belongs to, parsed once from TF_CONFIG, Vertex AI's
CLUSTER_SPEC or the seeds' flags into a `ClusterInfo`; no other module reads them.
Parsing imports no TensorFlow, so a malformed cluster is reported (exit status 2)
before any server starts. Accepted, first match wins:

- the seeds' flags `--ps-hosts --worker-hosts --job-name --task-index` (worker 0 is the
  chief); refused when TF_CONFIG or CLUSTER_SPEC is also set;
- TF_CONFIG as Cloud ML, `gcloud ai-platform local train`, Kubeflow's TFJob and Vertex
  AI set it: `{"cluster": {...}, "task": {"type": ..., "index": ...}}` with
  `environment`, `job` (object or JSON string), `trial` and `cloud` tolerated, an index
  as a digit string accepted, `master` (legacy chief) renamed to `chief` (TensorFlow's
  ParameterServerStrategy refuses it), and an evaluator listed in `cluster` (some
  Kubeflow versions do that) left out of it (TensorFlow's strategies hang on it);
- CLUSTER_SPEC (Vertex AI), when TF_CONFIG is unset: `workerpool0`..`workerpool3`
  become chief, worker, ps and evaluator;
- none (or a cluster holding only the chief): a single node.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
from collections.abc import Mapping

from mljob.contracts import CHIEF, EVALUATOR, MASTER, PS, ROLES, WORKER
from mljob.errors import UsageError, first_line

TRAINING_JOBS = (CHIEF, WORKER, PS)
TOLERATED_KEYS = ("cluster", "task", "environment", "job", "trial", "cloud", "rpc_layer")
# Vertex AI's worker pools by position (workerPoolSpecs[0..3]); a Reduction Server in
# pool 2 would be taken for parameter servers (not supported).
VERTEX_POOLS = {"workerpool0": CHIEF, "workerpool1": WORKER, "workerpool2": PS,
                "workerpool3": EVALUATOR}
CLUSTER_SPEC_KEYS = ("cluster", "task", "environment", "job")
STRATEGIES = ("auto", "ps", "multiworker", "mirrored", "single")

_ADDRESS = re.compile(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.\-]+):([0-9]{1,5})")  # fullmatch


class ClusterConfigError(UsageError, ValueError):
    """The cluster description is malformed; the message names the problem and the fix."""


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """This replica's place in the job.

    `cluster` is the training cluster as TensorFlow must see it: jobs `chief`, `worker`
    and `ps` only (master renamed, evaluators removed), each a tuple of host:port.
    `task_type` is one of chief, worker, ps, evaluator; `legacy_master` records that the
    job called its chief `master`, so logs and labels can keep the user's name. `source`
    names what described the cluster (TF_CONFIG, CLUSTER_SPEC, the seeds' flags; "": none).
    """

    task_type: str = CHIEF
    task_index: int = 0
    cluster: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    legacy_master: bool = False
    environment: str | None = None
    trial: str | None = None
    source: str = ""
    has_evaluator: bool = False  # the job has an evaluator replica (outside `cluster`)

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
    config = _load_object(text, "TF_CONFIG", TOLERATED_KEYS,
                          '{"cluster": {"chief": ["host:2222"]}, '
                          '"task": {"type": "chief", "index": 0}}')
    cluster, task = _cluster_and_task(config, "TF_CONFIG", "chief, worker, ps")
    info = _build(cluster, task, source="TF_CONFIG",
                  **_labels(config, task.get("trial", config.get("trial"))))
    job = config.get("job")
    if isinstance(job, str):  # Cloud ML's trainingInput, as an object or its JSON text
        try:
            job = json.loads(job)
        except (ValueError, RecursionError):
            job = None
    count = job.get("evaluatorCount") if isinstance(job, dict) else None
    listed = bool(cluster.get(EVALUATOR)) or info.is_evaluator
    counted = isinstance(count, int) and not isinstance(count, bool) and count > 0 or \
        isinstance(count, str) and _is_index(count) and int(count) > 0
    return dataclasses.replace(info, has_evaluator=listed or counted)


def parse_cluster_spec(text: str | None) -> ClusterInfo:
    """Parse Vertex AI's CLUSTER_SPEC: worker pools 0..3 become chief, worker, ps and
    evaluator; None or blank means a single-node run."""
    if text is None or not text.strip():
        return ClusterInfo()
    config = _load_object(text, "CLUSTER_SPEC", CLUSTER_SPEC_KEYS,
                          '{"cluster": {"workerpool0": ["host:2222"]}, '
                          '"task": {"type": "workerpool0", "index": 0}}')
    cluster, task = _cluster_and_task(config, "CLUSTER_SPEC", "workerpool0..3")
    unknown = [pool for pool in cluster if pool not in VERTEX_POOLS]
    pool = task.get("type")
    if unknown or (task and (not isinstance(pool, str) or pool not in VERTEX_POOLS)):
        what = f"cluster has unknown worker pool {unknown[0]!r}" if unknown else \
            f"task type {pool!r} is unknown"
        raise ClusterConfigError(f"CLUSTER_SPEC {what}; use Vertex AI's pools " + ", ".join(
            f"{name} ({role})" for name, role in VERTEX_POOLS.items()))
    chief = cluster.get("workerpool0")
    if isinstance(chief, list) and len(chief) > 1:
        raise ClusterConfigError(
            f"CLUSTER_SPEC workerpool0 has {len(chief)} replicas, but it is the chief; "
            "set its replicaCount to 1 and put the other replicas in workerpool1")
    if any(cluster.values()) and not chief:
        raise ClusterConfigError(
            "CLUSTER_SPEC has worker pools but no workerpool0; Vertex AI's first pool is "
            "the chief (primary replica) and is required, with replicaCount 1")
    roles = {VERTEX_POOLS[name]: hosts for name, hosts in cluster.items()}
    if task:
        assert isinstance(pool, str)  # checked above: a task's type is one of VERTEX_POOLS
        task = dict(task, type=VERTEX_POOLS[pool])
    info = _build(roles, task, source="CLUSTER_SPEC", **_labels(config, task.get("trial")))
    return dataclasses.replace(info, has_evaluator=bool(roles.get(EVALUATOR))
                               or info.is_evaluator)


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
    """The one entry point: flags when given, else TF_CONFIG, else CLUSTER_SPEC (Vertex
    AI sets both for TensorFlow; TF_CONFIG wins), else a single node."""
    flags_given = any(v is not None for v in (ps_hosts, worker_hosts, job_name, task_index))
    tf_config, cluster_spec = environ.get("TF_CONFIG") or "", environ.get("CLUSTER_SPEC") or ""
    if flags_given:
        for name, value in (("TF_CONFIG", tf_config), ("CLUSTER_SPEC", cluster_spec)):
            if value.strip():
                raise ClusterConfigError(
                    f"both {name} and --ps-hosts/--worker-hosts describe the cluster; "
                    f"unset {name} or drop the flags")
        return parse_flags(ps_hosts, worker_hosts, job_name, task_index)
    if tf_config.strip():
        return parse_tf_config(tf_config)
    return parse_cluster_spec(cluster_spec)


def _load_object(text: str, name: str, allowed: tuple, example: str) -> dict:
    """The variable's JSON object, its keys checked against `allowed`."""
    try:
        config = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ClusterConfigError(
            f"{name} is not valid JSON ({_short(exc)}); set it to an object like "
            f"{example}") from None
    if not isinstance(config, dict):
        raise ClusterConfigError(
            f"{name} must be a JSON object, not {type(config).__name__}; set it to an "
            f"object like {example}")
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        raise ClusterConfigError(
            f"{name} has unknown key {unknown[0]!r}; allowed keys are {', '.join(allowed)}")
    return config


def _cluster_and_task(config: dict, name: str, jobs: str) -> tuple[dict, dict]:
    cluster, task = config.get("cluster") or {}, config.get("task") or {}
    if not isinstance(cluster, dict):
        raise ClusterConfigError(
            f"{name} 'cluster' must be an object mapping job names ({jobs}) to lists "
            "of host:port")
    if not isinstance(task, dict):
        raise ClusterConfigError(
            f'{name} \'task\' must be an object like {{"type": ..., "index": 0}}')
    return cluster, task


def _labels(config: dict, trial) -> dict:
    """environment and trial for ClusterInfo; Vertex AI sets trial "" outside tuning."""
    environment = config.get("environment")
    return {"environment": environment if isinstance(environment, str) else None,
            "trial": None if trial is None or trial == "" else str(trial)}


def _build(cluster: dict, task: dict, *, source: str, environment: str | None = None,
           trial: str | None = None) -> ClusterInfo:
    """Check a cluster in TensorFlow's job names (chief/master, worker, ps, evaluator)
    and this replica's task in it; `source` names the input in every message."""
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
            value = _dense_hosts(value, job, source)
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
    seen: dict[tuple[str, int], tuple[str, str]] = {}
    for job, addresses in hosts.items():
        for i, address in enumerate(addresses):
            where, key = f"{job} {i}", normal_address(address)
            if key in seen:
                first, was = seen[key]
                same = address if was == address else f"{was} (as {address})"
                raise ClusterConfigError(
                    f"{source} cluster gives address {same} to both {first} and {where}; "
                    "every task needs its own host:port")
            seen[key] = (where, address)

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
    if isinstance(task_index, str) and _is_index(task_index):  # Kubeflow variants
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
            f"list the cluster's hosts, or unset {source} for a single-node run")

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
                       legacy_master=legacy_master, environment=environment, trial=trial,
                       source=source)


def _is_index(text: str) -> bool:
    """ASCII digits only: str.isdecimal() also takes "３" and "٣", which int() reads but
    TensorFlow and every other reader of TF_CONFIG do not."""
    return text.isascii() and text.isdecimal()


def _dense_hosts(value: dict, job: str, source: str) -> list | None:
    """A job given as {index: address}, as a list; None when the keys are not indexes.
    Kubeflow's enableDynamicWorker lists only the replica itself: no strategy trains so."""
    if not all(isinstance(k, str) and _is_index(k) for k in value):
        return None
    indexes = sorted(int(k) for k in value)
    if indexes != list(range(len(indexes))):
        raise ClusterConfigError(
            f"{source} cluster job {job!r} lists only task(s) {indexes[:5]} (sparse, as "
            "Kubeflow's enableDynamicWorker sets it); list every task, e.g. turn it off")
    return [value[k] for k in sorted(value, key=int)]


def _check_address(address: str, where: str) -> None:
    match = _ADDRESS.fullmatch(address)
    if not match or not 0 < int(match.group(2)) < 65536:
        raise ClusterConfigError(
            f"{where} has bad address {address!r}; write it as host:port with a port "
            "from 1 to 65535")


def normal_address(address: str) -> tuple[str, int]:
    """(host, port) as a server binds it, so one address written two ways compares
    equal: the port as a number (02325 is 2325), the host without case or a trailing
    dot, and every loopback spelling (localhost, 127.x.x.x, ::1) as one."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]").lower().rstrip(".")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if host == "localhost" or host.endswith(".localhost") or ip is not None and \
            ip.is_loopback:
        host = "loopback"
    elif ip is not None:
        host = ip.compressed
    return host, int(port)


def _split_hosts(value: str, flag: str) -> list[str]:
    hosts = [h.strip() for h in value.split(",") if h.strip()]
    for address in hosts:
        _check_address(address, flag)
    return hosts


def _short(exc: Exception) -> str:
    return first_line(exc, 120)
