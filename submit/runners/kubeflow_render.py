"""The Kubeflow TFJob (kubeflow.org/v1) for a job, as a plain dict: pure rendering, no
cluster calls (those are `submit.runners.kubeflow`), so `--dry-run` and the tests need no
cluster and no kubernetes client.

The TFJob has one replica spec per replica type: Chief (or Master when the config asks
for Cloud ML's legacy name), Worker, PS and Evaluator, with the counts of the scale tier
or config.yaml. Every replica runs the same container, `--image`, which holds the staged
sdist installed on TensorFlow 2.21 (the Dockerfile is generated; `--dry-run` prints it),
and the same command `python -m mljob.fitting.launch <module> <args> --job-dir <gs://...>`
(`python -m <module>` with Keras's `fit` made distributed: `mljob.fitting`). The operator sets
TF_CONFIG (lower-cased types, port 2222), which the trainer reads unchanged.

Decisions:
- Restart policies are the TFJob's own (we took their names from it); `runPolicy.
  backoffLimit` is the largest `maxRestarts` when any type restarts.
- `cleanPodPolicy: Running`: when the job ends the operator deletes the pods still
  running (parameter servers, evaluators), so none outlives the job, and keeps finished
  pods so that their logs can still be read.
- `successPolicy: ""` is the operator's default: the job succeeds when the chief does.
  The operator then deletes the running evaluator, which may not yet have seen the
  chief's final checkpoint: its pod gets `terminationGracePeriodSeconds`
  (STOP_GRACE_SECONDS) and mljob's evaluator, on SIGTERM, evaluates the newest
  checkpoint once more before it exits (mljob/training/evaluator.py).
- A cancelled (deleted) job's pods are all signalled at once. Every pod gets the same
  grace period, so the chief can save; ps and worker pods wait in a preStop hook while
  the chief still answers (WAIT_FOR_CHIEF), so they serve its save and go after it.
- The job's labels (config.yaml's and --labels) label the TFJob and its pods, beside
  mljob's own. `scheduling.maxRunningTime` is `runPolicy.activeDeadlineSeconds`;
  `maxWaitTime` is `runPolicy.schedulingPolicy.scheduleTimeoutSeconds`, which the
  operator honours only under gang scheduling (docs/engine-kubeflow.md).
- Machine types map to resource requests (`mljob.machines`, docs/engine-kubeflow.md): the
  machine's vCPUs and memory are requested, memory is also the limit, GPUs go in limits
  as `nvidia.com/gpu`, and a GPU type in `acceleratorConfig` becomes GKE's
  `cloud.google.com/gke-accelerator` node selector.
- `--queue`/`scheduling.queueName` is Kueue's label `kueue.x-k8s.io/queue-name` on the
  TFJob (not its pods) with `runPolicy.suspend: true`, for Kueue to resume when it admits
  the job; `scheduling.ttlAfterFinished` is `runPolicy.ttlSecondsAfterFinished`;
  `scheduling.strategy: SPOT` selects GKE's Spot nodes (`cloud.google.com/gke-spot`).
- The TFJob's name is the job id in lower case with `-` for `_` (Kubernetes names are
  DNS labels); the job id itself is kept in the label `mljob/job-id`.
"""
from __future__ import annotations

import hashlib
import math
import os
import re
import shlex
import shutil
import tempfile
from typing import Any

import yaml

from mljob import contracts, machines
from mljob.fitting import LAUNCHER
from submit.jobdef import containers, spec as specs
from submit.errors import UsageError
from submit.home import mljob_home
from submit.packaging.package import Package

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "tfjobs"
CONTAINER, PORT_NAME, PORT = "tensorflow", "tfjob-port", 2222  # what the operator expects
BASE_IMAGE, BASE_IMAGE_GPU = "tensorflow/tensorflow:2.21.0", "tensorflow/tensorflow:2.21.0-gpu"
# Every pod's grace period: long enough for the chief to save after SIGTERM and for the
# evaluator's last look at the checkpoints (the stop watchdog ends either after
# STOP_DEADLINE_SECONDS), and for the ps' and workers' preStop wait below, so the
# kubelet's SIGKILL never cuts them short (Kubernetes' default is 30 s).
EVALUATOR_GRACE_SECONDS = STOP_GRACE_SECONDS = math.ceil(contracts.STOP_DEADLINE_SECONDS) + 30
# A deleted job's pods are all signalled at once; a ps or worker gone first would leave
# the chief unable to save (`ps-replica-0 stopped answering`). So the ps' and workers'
# preStop hook (run by the kubelet before the container's SIGTERM) waits while the chief
# still answers at its TF_CONFIG address, at most the chief's stop deadline.
WAIT_FOR_CHIEF = (
    "import json, os, socket, time\n"
    "c = json.loads(os.environ.get('TF_CONFIG') or '{}').get('cluster', {})\n"
    "host, _, port = ((c.get('chief') or c.get('master') or [''])[0]).rpartition(':')\n"
    f"end = time.monotonic() + {math.ceil(contracts.STOP_DEADLINE_SECONDS) + 5}\n"
    "while host and time.monotonic() < end:\n"
    "    try:\n"
    "        socket.create_connection((host, int(port)), 2).close()\n"
    "    except (OSError, ValueError):\n"
    "        break\n"
    "    time.sleep(1)\n")
MAX_NAME = 50   # pods are <name>-<type>-<index>; their services must stay DNS labels (63)
REPLICA_TYPES = {specs.CHIEF: "Chief", specs.WORKER: "Worker", specs.PS: "PS",
                 specs.EVALUATOR: "Evaluator"}
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # fullmatch: `$` takes "\n"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # Kueue's LocalQueue of the job
SPOT_LABEL = "cloud.google.com/gke-spot"  # scheduling.strategy SPOT, on GKE
K8S_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def machine_resources(machine: str, gpus: int) -> tuple[int, float, int]:
    """(vCPUs, GiB, GPUs) of a Cloud ML or Compute Engine n1 machine name; `gpus`, when
    not 0, is acceleratorConfig.count and overrides the machine's own."""
    entry = machines.lookup(machine)
    return entry.vcpus, entry.memory_gib, machines.gpus(machine, gpus)


def resources(group: specs.ReplicaGroup, accelerator_count: int) -> dict:
    cpus, memory, gpus = machine_resources(group.machine_type, accelerator_count)
    mem = f"{round(memory * 1024)}Mi"
    out = {"requests": {"cpu": str(cpus), "memory": mem}, "limits": {"memory": mem}}
    if gpus:
        out["limits"]["nvidia.com/gpu"] = str(gpus)
    return out


def tfjob_name(job_id: str) -> str:
    name = job_id.lower().replace("_", "-")
    if len(name) > MAX_NAME or not DNS_LABEL.fullmatch(name):
        raise UsageError(f"job id {job_id!r} cannot name a TFJob: with --runner kubeflow "
                         f"use at most {MAX_NAME} characters, ending in a letter or digit")
    return name


def dockerfile(package: Package, gpu: bool) -> str:
    """Install the job's archives on TensorFlow's image: the package, its `--packages`,
    and mljob's core when the user's code imports mljob. The base provides TensorFlow
    2.21, so each archive's own TensorFlow requirement, if it has one, is left out: pip
    would otherwise lay a second TensorFlow (tensorflow-cpu, say) over the base's."""
    archives = [f"/tmp/mljob-packages/{p.file_name}" for p in package.all]
    dists = [p.dist_name for p in package.all]
    deps = ('import importlib.metadata as m, re, subprocess, sys; '
            f'r = [q for d in {dists!r} for q in m.requires(d) or [] if "extra ==" not in q '
            'and not re.match(r"tensorflow(-cpu|-gpu)?(?![\\w.-])", q)]; '
            'r and subprocess.check_call([sys.executable, "-m", "pip", "install", '
            '"--no-cache-dir", *r])')
    return "\n".join([
        f"# The trainer of {package.file_name} (sha256 {package.sha256[:12]}) on "
        "TensorFlow 2.21.",
        f"FROM {BASE_IMAGE_GPU if gpu else BASE_IMAGE}",
        *(f"COPY {p.file_name} {a}" for p, a in zip(package.all, archives, strict=True)),
        f"RUN pip install --no-cache-dir --no-deps {' '.join(archives)} \\",
        f" && python -c {shlex.quote(deps)} \\",
        " && rm -r /tmp/mljob-packages",
        "WORKDIR /",
        ""])


def build_context(package: Package, gpu: bool) -> str:
    """`$MLJOB_HOME/images/<hash>/`: the Dockerfile and the archives, ready for `docker
    build`. Written to a temporary folder and renamed into place, once per package set."""
    key = package.sha256 if not package.extras else hashlib.sha256(
        " ".join(p.sha256 for p in package.all).encode()).hexdigest()
    folder = os.path.join(mljob_home(), "images", key[:16] + ("-gpu" if gpu else ""))
    if os.path.isdir(folder):
        return folder
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(folder))
    try:
        with open(os.path.join(tmp, "Dockerfile"), "w") as f:
            f.write(dockerfile(package, gpu))
        for each in package.all:
            assert each.local_file is not None  # the engine asks only when all are local
            shutil.copyfile(each.local_file, os.path.join(tmp, each.file_name))
        os.rename(tmp, folder)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isdir(folder):  # not a concurrent build that won the race
            raise
    return folder


def check_labels(spec: specs.JobSpec) -> None:
    """Google Cloud takes label values that Kubernetes refuses: one ending in `-` or `_`."""
    for key, value in spec.labels.items():
        if value and not K8S_LABEL_VALUE.fullmatch(value):
            raise UsageError(f"label {key}={value} cannot label a TFJob: Kubernetes label "
                             "values start and end with a letter or digit; change it for "
                             "--runner kubeflow")


def tfjob(spec: specs.JobSpec, package: Package | None, *, name: str, namespace: str, image: str,
          service_account: str | None = None, queue: str | None = None) -> dict:
    """The TFJob as the API takes it."""
    labels = {**spec.labels, "app.kubernetes.io/managed-by": "mljob",
              "mljob/job-id": spec.job_id}
    replica_specs = {}
    for group in spec.groups:
        kind = REPLICA_TYPES[group.task_type]
        if group.task_type == specs.CHIEF and not spec.use_chief:
            kind = "Master"
        replica_specs[kind] = replica_spec(spec, group, image, labels, service_account)
    most = max((g.max_restarts for g in spec.groups if g.restart_policy != "Never"),
               default=None)
    run_policy: dict[str, Any] = {"cleanPodPolicy": "Running"}
    if most is not None:
        run_policy["backoffLimit"] = most
    if spec.max_running_time is not None:
        run_policy["activeDeadlineSeconds"] = math.ceil(spec.max_running_time)
    if spec.max_wait_time is not None:
        run_policy["schedulingPolicy"] = {
            "scheduleTimeoutSeconds": math.ceil(spec.max_wait_time)}
    ttl = spec.engine.ttl_seconds
    if ttl is not None:
        run_policy["ttlSecondsAfterFinished"] = ttl
    if queue:
        run_policy["suspend"] = True  # Kueue admits it by resuming it
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "TFJob",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {**labels, QUEUE_LABEL: queue} if queue else labels,
                     "annotations": {"mljob/package-uri": package.url or "",
                                     "mljob/package-sha256": package.sha256}
                     if package else {}},
        "spec": {"runPolicy": run_policy, "successPolicy": "",
                 "tfReplicaSpecs": replica_specs}}


def dry_run_text(spec: specs.JobSpec, package: Package | None, body: dict, image: str,
                 kind: str = "TFJob") -> str:
    """The TFJob (or a tuning job's Experiment) as YAML, under a header holding the
    image's Dockerfile (custom containers: the images they name, nothing to build)."""
    if package is None:
        header = [f"# {kind} for mljob job {spec.job_id}; apply it with `kubectl apply "
                  "-f -` or submit without --dry-run.",
                  "# Custom containers: " + ", ".join(
                      f"{g.task_type} runs {g.image_uri}" for g in spec.groups)]
        return "\n".join(header) + "\n" + yaml.safe_dump(body, sort_keys=False,
                                                         default_flow_style=False)
    docker = dockerfile(package, gpu=spec.gpus_needed > 0)
    header = [f"# {kind} for mljob job " + spec.job_id + "; apply it with "
              "`kubectl apply -f -` or submit without --dry-run.",
              f"# Every replica runs --image {image}, built from the staged "
              f"package {package.file_name} with this Dockerfile:", "#"]
    header += [f"#   {line}" for line in docker.rstrip("\n").splitlines()]
    return "\n".join(header) + "\n" + yaml.safe_dump(body, sort_keys=False,
                                                     default_flow_style=False)


def replica_spec(spec: specs.JobSpec, group: specs.ReplicaGroup, image: str,
                 labels: dict, service_account: str | None) -> dict:
    container: dict[str, Any] = {
        "name": CONTAINER, "image": group.image_uri or image,
        "command": ["python", "-m", LAUNCHER, spec.module_name],
        # every string the kubelet expands `$(VAR)` in is escaped (TF_CONFIG's too)
        "args": [containers.kubelet_literal(a)
                 for a in containers.args_for(group, spec.trainer_args)],
        "env": [{"name": contracts.JOB_ID_ENV,
                 "value": containers.kubelet_literal(spec.job_id)},
                {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": PORT_NAME, "containerPort": PORT}]}
    if group.image_uri:  # the image's own entrypoint unless containerCommand names one
        container.pop("command")
        if group.container_command:
            container["command"] = [containers.kubelet_literal(c)
                                    for c in group.container_command]
    container["resources"] = resources(group, group.accelerator_count)
    if group.task_type in (specs.PS, specs.WORKER) and not group.image_uri:
        # (a custom image may hold no `python`: its pods stop as Kubernetes stops them)
        container["lifecycle"] = {"preStop": {"exec": {
            "command": ["python", "-c", WAIT_FOR_CHIEF]}}}
    pod: dict[str, Any] = {"containers": [container],
                           "terminationGracePeriodSeconds": STOP_GRACE_SECONDS}
    if service_account:
        pod["serviceAccountName"] = service_account
    accelerator = group.accelerator_type
    if accelerator and group.gpus:
        pod["nodeSelector"] = {"cloud.google.com/gke-accelerator":
                               accelerator.lower().replace("_", "-")}
    if spec.engine.strategy == "SPOT":  # GKE's Spot VMs
        pod["nodeSelector"] = {**pod.get("nodeSelector", {}), SPOT_LABEL: "true"}
    return {"replicas": group.count, "restartPolicy": group.restart_policy,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod}}
