"""Custom containers on the local runner: each replica of a job whose replicas name an
image (`--master-image-uri`, imageUri) runs as a container of the engine
(`submit.local.container_engine`), supervised as a replica process is
(`submit.local.supervisor`): the replica's process is the engine's attached `run`, whose
output is the container's and whose exit status is the container's.

As Cloud ML gives it, each replica gets:
- a network of the job's own (`mljob-<job id>`), where it answers to its label
  (`master-replica-0`, `worker-replica-1`) on port 2222; TF_CONFIG's cluster names
  those hosts;
- `TF_CONFIG`, `CLOUD_ML_JOB_ID` and the launcher's own settings (unbuffered output,
  TensorFlow's log level and thread count), and none of this machine's other variables;
- the job dir, when it is on this machine, mounted at the same path (so `--job-dir`
  reads the same inside), and for a memory:// job dir the local folder mirrored to it;
- `containerCommand` as its entrypoint and `containerArgs` (else the trainer args and
  `--job-dir`) as its arguments.

Stopping: SIGTERM to the engine's `run` reaches the container (the engine proxies it),
so the stop order holds as for processes; the SIGKILL after the grace period also
removes the container, and the job's end removes whatever carries its label, and its
network (`container_engine.remove_job`).
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import os

from mljob import contracts, machines, storage
from mljob.errors import ascii_digits
from submit.local import container_engine as ce
from submit.local.plan import JobPlan, ReplicaPlan
from submit.errors import UsageError
from submit.jobdef.spec import JobSpec

# What reaches a container from the launcher's environment for a replica (by name).
PASSED = ("TF_CONFIG", contracts.JOB_ID_ENV, "PYTHONUNBUFFERED", "GRPC_FAIL_FAST",
          "TF_NUM_INTRAOP_THREADS", "TF_CPP_MIN_LOG_LEVEL", contracts.STOP_DEADLINE_ENV,
          contracts.TRIAL_ID_ENV)
DROPPED = ("PYTHONPATH", "CUDA_VISIBLE_DEVICES")  # the host's, meaningless inside
FIRST_HOST = 10  # replicas' addresses on the job's network: .10, .11, ... in plan order
SHARES_PER_VCPU = 1024  # a container's CPU weight per vCPU of its machine type
# Each container's address on its job's network, fixed when the network is made
# (`prepare`): a restarted replica comes back at the same address, as its peers' gRPC
# channels (which resolved its name once) expect.
_ADDRESSES: dict[str, str] = {}
# Each container's cgroup parent (`prepare`, `ce.cgroup_parent`).
_PARENTS: dict[str, str] = {}


def uses_containers(spec: JobSpec) -> bool:
    return any(g.image_uri for g in spec.groups)


def images(spec: JobSpec) -> list[str]:
    return list(dict.fromkeys(g.image_uri for g in spec.groups if g.image_uri))


def host(label: str) -> str:
    return label  # a replica's host name on the job's network is its label


def containerize(plan: JobPlan, spec: JobSpec, engine: ce.Engine) -> JobPlan:
    """The plan with each replica's command the engine's `run` of its container."""
    addresses = {r.label: f"{host(r.label)}:{ce.PORT}" for r in plan.replicas}
    cluster = {kind: tuple(_host_of(a, plan, addresses) for a in hosts)
               for kind, hosts in plan.cluster.items()}
    mounts = _mounts(plan)
    replicas = []
    for r in plan.replicas:
        group = spec.group(_spec_type(r))
        assert group is not None and group.image_uri  # containerize only container jobs
        tf_config = {**r.tf_config, "cluster": {k: list(v) for k, v in cluster.items()}}
        env = {k: v for k, v in r.env.items() if k not in DROPPED}
        env["TF_CONFIG"] = json.dumps(tf_config, sort_keys=True)
        args = list(group.container_args if group.container_args is not None
                    else plan.trainer_args)
        argv = ce.run_argv(
            engine, job_id=plan.job_id, label=r.label, image=group.image_uri,
            hostname=host(r.label), env_keys=PASSED, mounts=mounts,
            entrypoint=group.container_command, args=args,
            gpus=ce.gpu_flags(engine, group.gpus, r.env.get("CUDA_VISIBLE_DEVICES")),
            cpu_shares=cpu_shares(group.machine_type))
        replicas.append(dataclasses.replace(
            r, command=tuple(argv), env=env, tf_config=tf_config,
            address=addresses[r.label] if r.address else None,
            container={"name": ce.container_name(plan.job_id, r.label),
                       "engine": engine.path, "kind": engine.kind,
                       "image": group.image_uri}))
    return dataclasses.replace(plan, replicas=tuple(replicas), cluster=cluster,
                               containers={"engine": engine.path, "kind": engine.kind,
                                           "network": ce.network_name(plan.job_id)})


def cpu_shares(machine_type: str) -> int | None:
    """A replica's CPU weight: its machine type's vCPUs, each weighing what one busy
    thread of a process does (as Kubernetes turns a pod's CPU request into shares)."""
    try:
        return SHARES_PER_VCPU * machines.lookup(machine_type).vcpus
    except KeyError:
        return None


def _spec_type(replica: ReplicaPlan) -> str:
    return "chief" if replica.is_chief else replica.task_type


def _host_of(address: str, plan: JobPlan, addresses: dict[str, str]) -> str:
    for r in plan.replicas:
        if r.address == address:
            return addresses[r.label]
    return address


def _mounts(plan: JobPlan) -> list[str]:
    """The job dir replicas write, when it is a folder on this machine."""
    job_dir = plan.replica_job_dir
    if job_dir and storage.is_local(job_dir):
        return [os.path.abspath(storage.local_path(job_dir))]
    return []


def engine_of(plan_containers) -> ce.Engine:
    return ce.Engine(plan_containers["kind"], plan_containers["engine"])


def prepare(plan: JobPlan) -> str:
    """Before the replicas start: what an earlier run of the job id left is removed, the
    job dir made (for its mount), and the job's network created; the line for the log."""
    assert plan.containers is not None
    engine = engine_of(plan.containers)
    ce.remove_job(engine, plan.job_id)
    for mount in _mounts(plan):
        os.makedirs(mount, exist_ok=True)
    out = ce.call(engine, *ce.network_create_argv(engine, plan.job_id)[1:])
    if out.returncode != 0:
        raise RuntimeError(f"{engine.kind} could not create network "
                           f"{ce.network_name(plan.job_id)}: {ce.first_line(out.stderr)}")
    if engine.kind == "podman":  # docker takes --ip only on a network given a subnet
        _fix_addresses(engine, plan)
    parent = ce.cgroup_parent(engine)
    if parent is not None:  # beside the replica processes' cgroup (ce.cgroup_parent)
        for replica in plan.replicas:
            if replica.container:
                _PARENTS[replica.container["name"]] = parent
    return (f"containers run by {engine.kind} ({engine.path}) on network "
            f"{ce.network_name(plan.job_id)}")


def _fix_addresses(engine: ce.Engine, plan: JobPlan) -> None:
    out = ce.call(engine, "network", "inspect", "--format",
                  "{{range .Subnets}}{{.Subnet}} {{end}}", ce.network_name(plan.job_id))
    try:
        subnet = ipaddress.ip_network(out.stdout.split()[0])
    except (IndexError, ValueError):
        return  # the engine assigns them (a restarted replica may then change address)
    hosts = list(subnet.hosts())[FIRST_HOST - 1:]
    for replica, address in zip(plan.replicas, hosts, strict=False):
        if replica.container:
            _ADDRESSES[replica.container["name"]] = str(address)


def command(replica: ReplicaPlan) -> tuple[str, ...]:
    """The replica's command as it starts now: a container's `run` gets its fixed
    address on the job's network and its job's cgroup parent (`prepare`)."""
    name = (replica.container or {}).get("name", "")
    extra: list[str] = []
    address = _ADDRESSES.get(name)
    if address is not None:
        extra += ["--ip", address]
    parent = _PARENTS.get(name)
    if parent is not None:
        extra += ["--cgroup-parent", parent]
    return (*replica.command[:2], *extra, *replica.command[2:]) if extra \
        else replica.command


def kill(replica: ReplicaPlan) -> None:
    """Remove a replica's container at once (killing it if it runs)."""
    info = replica.container
    if info:
        engine = ce.Engine(info["kind"], info["engine"])
        ce.call(engine, *ce.rm_argv(engine, [info["name"]])[1:])


def stopped(replica: ReplicaPlan) -> bool:
    """Whether a replica's container has stopped by itself (or is gone) while the
    engine's `run` still tears it down (its network, its storage, `--rm`): its status
    is the container's, and the supervisor waits for it rather than SIGKILL the `run`
    (which would record 137). False for a replica that is not a container."""
    info = replica.container
    if not info:
        return False
    engine = ce.Engine(info["kind"], info["engine"])
    out = ce.call(engine, "inspect", "--format", "{{.State.Running}}", info["name"],
                  timeout=10)
    return out.returncode != 0 or out.stdout.strip() == "false"


def host_pid(replica: ReplicaPlan) -> int | None:
    """The PID on this machine of the replica's container (its init, whose child is the
    replica): what its resource figures are sampled from. None until it runs."""
    info = replica.container
    if not info:
        return None
    engine = ce.Engine(info["kind"], info["engine"])
    out = ce.call(engine, "inspect", "--format", "{{.State.Pid}}", info["name"], timeout=10)
    text = out.stdout.strip()
    return int(text) if out.returncode == 0 and ascii_digits(text) and int(text) > 0 else None


def clean_up(plan: JobPlan) -> None:
    """Every container and the network of the job gone (called at every end)."""
    if plan.containers is not None:
        ce.remove_job(engine_of(plan.containers), plan.job_id)
        for replica in plan.replicas:
            _ADDRESSES.pop((replica.container or {}).get("name", ""), None)
            _PARENTS.pop((replica.container or {}).get("name", ""), None)


def check(spec: JobSpec) -> None:
    """What the local runner cannot run in containers (before anything else is asked)."""
    if spec.tuning is not None:
        raise UsageError("hyperparameter tuning with custom containers runs on --runner "
                         "kubeflow or vertex; on the local runner give a package "
                         "(--package-path) instead of the image")


def engine_for_render(choice: str | None) -> ce.Engine:
    """The engine a plan names: the one chosen or detected, else the choice (or podman)
    by name (a dry run renders without an engine; submitting checks it first,
    `preflight`)."""
    try:
        return ce.detect(choice)
    except UsageError:
        name = choice or os.environ.get(ce.ENGINE_ENV) or "podman"
        return ce.Engine(os.path.basename(name), name)


def preflight(rendered) -> None:
    """Before the job is created: the engine is there and can start containers, and every
    image is in its local store (each a one-line UsageError naming the fix)."""
    plan = JobPlan.from_dict(rendered.body)
    if plan.containers is None:
        return
    engine = ce.detect(plan.containers["engine"])
    wanted = [r.container["image"] for r in plan.replicas if r.container]
    ce.check_images(engine, wanted)
    ce.probe(engine, wanted[0])
