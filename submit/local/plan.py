"""The resolved job as a plain value: what `--dry-run` prints and what a runner executes.

A plan names every replica (label, command, environment, TF_CONFIG, log file), the
staged package, and the folders the runner uses. Nothing in it is decided while running
except `MLJOB_PARENT_PID`, which the runner adds (the supervising process may be a
detached one started by `--async`).

Job dirs and what replicas see:
- local path: replicas write the job dir itself; logs go to `<job-dir>/logs/`.
- gs://: replicas write the job dir through gcsfs; logs are written locally under the
  run folder and mirrored to `<job-dir>/logs/`.
- memory://: the store lives in the submitting process only, so replicas get a local
  scratch job dir (`$MLJOB_HOME/runs/<job-id>/job-dir`), mirrored into the memory:// job
  dir while the job runs and completely before it is marked SUCCEEDED.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from submit.packaging import package as packages
from submit.jobdef import spec as specs
from submit.jobdef import tuning_spec
from submit.packaging.package import Package
from mljob import contracts, storage
from mljob.fitting import LAUNCHER
from mljob.procs import free_ports

ORDER = (specs.PS, specs.WORKER, specs.CHIEF, specs.EVALUATOR)  # start order
INTRAOP_THREADS_ENV = "TF_NUM_INTRAOP_THREADS"  # read by TensorFlow when it starts


@dataclasses.dataclass(frozen=True)
class ReplicaPlan:
    """One process: `task_type` as TF_CONFIG names it (chief or master, worker, ps,
    evaluator); `env` holds what the runner sets on top of its own environment."""

    label: str
    task_type: str
    index: int
    address: str | None
    command: tuple[str, ...]
    env: Mapping[str, str]
    tf_config: Mapping[str, Any]
    log_file: str
    restart_policy: str = "Never"   # this replica's, from its type's group
    max_restarts: int = 0
    container: Mapping[str, str] | None = None   # a custom container's (submit.local.containers)

    @property
    def is_chief(self) -> bool:
        return self.task_type in (specs.CHIEF, specs.MASTER)


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """The whole job. `mirrors` pairs local folders with the URLs they are copied to."""

    job_id: str
    mode: str                      # "cloud" (staged package) or "local" (working tree)
    scale_tier: str
    job_dir: str | None
    replica_job_dir: str | None
    run_dir: str
    log_dir: str
    mirrors: tuple[tuple[str, str], ...]
    package_url: str | None
    package_sha256: str | None
    package_top_dir: str | None
    python_path: str               # "" for a staged package: nothing shadows what it installs
    cwd: str
    module: str
    trainer_args: tuple[str, ...]
    cluster: Mapping[str, tuple[str, ...]]
    training_input: Mapping[str, Any]
    replicas: tuple[ReplicaPlan, ...]
    restart_policy: str = "Never"
    max_restarts: int = 0
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    max_running_time: float | None = None   # seconds, scheduling.maxRunningTime
    max_wait_time: float | None = None      # seconds, scheduling.maxWaitTime
    # cloud mode: the archives pip-installs into the environment `env_key` under `env_root`
    packages: tuple[Mapping[str, str], ...] = ()
    env_root: str | None = None
    env_key: str | None = None
    tuning: tuning_spec.TuningSpec | None = None   # a tuning job's spec: trials of this plan
    containers: Mapping[str, str] | None = None    # custom containers: engine and network

    @property
    def chief(self) -> ReplicaPlan:
        return next(r for r in self.replicas if r.is_chief)

    def to_dict(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping) -> "JobPlan":
        data = dict(data)
        data["replicas"] = tuple(ReplicaPlan(**{**r, "command": tuple(r["command"])})
                                 for r in data["replicas"])
        data["mirrors"] = tuple(tuple(m) for m in data["mirrors"])
        data["trainer_args"] = tuple(data["trainer_args"])
        data["cluster"] = {k: tuple(v) for k, v in data["cluster"].items()}
        data["packages"] = tuple(data.get("packages", ()))
        if data.get("tuning") is not None:
            data["tuning"] = tuning_spec.from_dict(data["tuning"])
        return cls(**data)


def build(spec: specs.JobSpec, package: Package | None, *, home: str,
          ports: list[int] | None = None, python: str | None = None,
          source_dir: str | None = None, gpus_available: int = 0,
          cores: int | None = None, environ: dict | None = None) -> JobPlan:
    """The plan for a staged package (cloud mode) or, with source_dir, the working tree
    (`local train` mode: no staging, the module runs from source_dir)."""
    python = python or sys.executable
    env_key = env_dir = None
    staged: list[dict[str, str]] = []  # cloud mode's archives, as the environment needs them
    job_dir = spec.job_dir
    run_dir, log_dir, replica_job_dir, mirrors = folders(spec, home)
    if source_dir is not None:
        python_path, cwd, mode = _with_launcher(source_dir), source_dir, "local"
    elif package is None:  # custom containers: the images hold the code
        python_path, cwd, mode = "", run_dir, "container"
    else:
        # The packages are pip-installed into an environment of their own; PYTHONPATH is
        # emptied so that no working tree (a `trainer/` folder) shadows what it holds.
        for p in package.all:
            assert p.url is not None  # staged: submission gives every archive its URL
            staged.append({"url": p.url, "sha256": p.sha256, "file_name": p.file_name})
        env_key = packages.environment_key(package.all, python)
        env_dir = packages.env_root(home)
        python = os.path.join(env_dir, env_key, "bin", "python")
        python_path, cwd, mode = "", run_dir, "cloud"  # `-m` imports from the cwd

    trainer_args = spec.args + (("--job-dir", replica_job_dir) if replica_job_dir else ())
    chief_name = specs.CHIEF if spec.use_chief else specs.MASTER
    training_types = [t for t in (specs.CHIEF, specs.WORKER, specs.PS) if spec.count(t)]
    n_ports = sum(spec.count(t) for t in training_types)
    ports = list(ports) if ports is not None else free_ports(n_ports)
    if len(ports) < n_ports:
        raise ValueError(f"{n_ports} ports needed, {len(ports)} given")
    cluster: dict[str, tuple[str, ...]] = {}
    for task_type in training_types:  # chief first, then workers, then ps (gcloud's order)
        name = chief_name if task_type == specs.CHIEF else task_type
        count = spec.count(task_type)
        cluster[name] = tuple(f"127.0.0.1:{p}" for p in ports[:count])
        ports = ports[count:]

    devices = assign_gpus(spec, gpus_available)
    threads = intra_op_threads(spec, cores or os.cpu_count() or 1,
                               os.environ if environ is None else environ)
    replicas = []
    base_env = {"PYTHONPATH": python_path, "PYTHONUNBUFFERED": "1",
                "GRPC_FAIL_FAST": "use_caller", contracts.JOB_ID_ENV: spec.job_id}
    for task_type in ORDER:
        for index in range(spec.count(task_type)):
            name = chief_name if task_type == specs.CHIEF else task_type
            tf_config = {"cluster": {k: list(v) for k, v in cluster.items()},
                         "task": {"type": name, "index": index},
                         "job": dict(spec.training_input), "environment": "cloud"}
            label = contracts.replica_label(task_type, index)
            hosts = cluster.get(name, ())
            group = spec.group(task_type)
            assert group is not None  # spec.count(task_type) > 0
            replicas.append(ReplicaPlan(
                label=label, task_type=name, index=index,
                address=hosts[index] if index < len(hosts) else None,
                command=(python, "-m", LAUNCHER, spec.module_name, *trainer_args),
                env={**base_env, "TF_CONFIG": json.dumps(tf_config, sort_keys=True),
                     **({"CUDA_VISIBLE_DEVICES": devices[label]} if label in devices
                        else {}), **threads},
                tf_config=tf_config, log_file=os.path.join(log_dir, f"{label}.log"),
                restart_policy=group.restart_policy, max_restarts=group.max_restarts))
    return JobPlan(
        job_id=spec.job_id, mode=mode, scale_tier=spec.scale_tier, job_dir=job_dir,
        replica_job_dir=replica_job_dir, run_dir=run_dir, log_dir=log_dir,
        mirrors=tuple(mirrors), package_url=package.url if package else None,
        package_sha256=package.sha256 if package else None,
        package_top_dir=package.top_dir if package else None, python_path=python_path,
        cwd=cwd, module=spec.module_name, trainer_args=trainer_args, cluster=cluster,
        training_input=dict(spec.training_input), replicas=tuple(replicas),
        restart_policy=spec.restart_policy, max_restarts=spec.max_restarts,
        labels=dict(spec.labels), max_running_time=spec.max_running_time,
        max_wait_time=spec.max_wait_time,
        packages=tuple(staged),
        env_root=env_dir, env_key=env_key, tuning=spec.tuning)


def _with_launcher(source_dir: str) -> str:
    """The working tree's PYTHONPATH, and after it the folder this mljob is imported from
    when that is a source tree rather than an installation (site-packages is on every
    replica's path already): the replicas run the launcher of the mljob that submits."""
    import site
    import mljob
    root = os.path.dirname(os.path.dirname(os.path.abspath(mljob.__file__)))
    installed = {os.path.abspath(p) for p in (*site.getsitepackages(),
                                              site.getusersitepackages())}
    if root in installed or root == os.path.abspath(source_dir):
        return source_dir
    return source_dir + os.pathsep + root


def folders(spec: specs.JobSpec, home: str) -> tuple[str, str, str | None,
                                                      list[tuple[str, str]]]:
    """The job's run folder, log folder, the job dir its replicas write, and the local
    folders mirrored to URLs (see the module docstring)."""
    run_dir = os.path.join(home, "runs", spec.job_id)
    job_dir = spec.job_dir
    replica_job_dir, mirrors = job_dir, []
    if job_dir is None:
        log_dir = os.path.join(run_dir, "logs")
    elif job_dir.startswith("memory://"):
        replica_job_dir = os.path.join(run_dir, "job-dir")
        log_dir = os.path.join(replica_job_dir, "logs")
        mirrors.append((replica_job_dir, job_dir))
    elif storage.is_local(job_dir):
        log_dir = os.path.join(storage.local_path(job_dir), "logs")
    else:
        log_dir = os.path.join(run_dir, "logs")
        mirrors.append((log_dir, storage.join(job_dir, "logs")))
    return run_dir, log_dir, replica_job_dir, mirrors


def intra_op_threads(spec: specs.JobSpec, cores: int, environ) -> dict[str, str]:
    """TF_NUM_INTRAOP_THREADS for every replica when several share this machine's cores:
    the cores over the replicas that compute (the workers, and the chief unless it only
    coordinates parameter servers), at least 1. Each TensorFlow process otherwise sizes
    its pool to every core, and the processes' threads fight over them (one thread each
    made a chief + 2 workers + 1 ps MLP job 12% faster on 2 cores, the CNN the same;
    bench/README.md). A value the user set in the environment wins."""
    computing = spec.count(specs.WORKER) + (0 if spec.count(specs.PS) else
                                            spec.count(specs.CHIEF))
    if computing < 2 or INTRAOP_THREADS_ENV in environ:
        return {}
    return {INTRAOP_THREADS_ENV: str(max(1, cores // computing))}


def assign_gpus(spec: specs.JobSpec, available: int) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES per replica label when the job uses GPUs: each replica gets
    the next `gpus` of the machine's devices in start order (wrapping round when the job
    asks for more than there are, so replicas share rather than fail), and a replica
    without GPUs gets none (`""`), as on Cloud ML, where a CPU machine has no GPU."""
    if not available or not spec.gpus_needed:
        return {}
    assigned, next_device = {}, 0
    for task_type in ORDER:
        group = spec.group(task_type)
        for index in range(spec.count(task_type)):
            label = contracts.replica_label(task_type, index)
            gpus = group.gpus if group else 0
            ids = [(next_device + i) % available for i in range(gpus)]
            next_device = (next_device + gpus) % available
            assigned[label] = ",".join(map(str, ids))
    return assigned
