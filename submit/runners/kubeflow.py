"""`--runner kubeflow`: the job as a Kubeflow Training Operator TFJob (kubeflow.org/v1).

The TFJob has one replica spec per replica type: Chief (or Master when the config asks
for Cloud ML's legacy name), Worker, PS and Evaluator, with the counts of the scale tier
or config.yaml. Every replica runs the same container, `--image`, which holds the staged
sdist installed on TensorFlow 2.21 (the Dockerfile is generated; `--dry-run` prints it),
and the same command `python -m <module> <args> --job-dir <gs://...>`. The operator sets
TF_CONFIG (lower-cased types, port 2222), which the trainer reads unchanged.

Decisions:
- Restart policies are the TFJob's own (we took their names from it); `runPolicy.
  backoffLimit` is the largest `maxRestarts` when any type restarts.
- `cleanPodPolicy: Running`: when the job ends the operator deletes the pods still
  running (parameter servers, evaluators), so none outlives the job, and keeps finished
  pods so that their logs can still be read.
- `successPolicy: ""` is the operator's default: the job succeeds when the chief does.
- Machine types map to resource requests (`MACHINES`, docs/engine-kubeflow.md): the
  machine's vCPUs and memory are requested, memory is also the limit, GPUs go in limits
  as `nvidia.com/gpu`, and a GPU type in `acceleratorConfig` becomes GKE's
  `cloud.google.com/gke-accelerator` node selector.
- The job dir must be gs://: pods cannot see this machine's files or memory://.
- The TFJob's name is the job id in lower case with `-` for `_` (Kubernetes names are
  DNS labels); the job id itself is kept in the label `mljob/job-id`.
- A tuning job (`trainingInput.hyperparameters`) is a Katib Experiment
  (kubeflow.org/v1beta1) whose trial template is that TFJob, each trial's parameters
  appended to the args as `--<name>=${trialParameters.<name>}` and its job dir
  `<job-dir>/<trial name>`. Its metrics collector is Katib's File collector in JSON
  format on the cloudml-hypertune file the trainer writes (CLOUD_ML_HP_METRIC_FILE, set
  in the template): Katib's default stdout collector would misread the progress lines
  (`examples/s=` becomes a metric `s`; training and eval `accuracy` share a name).
  ALGORITHM_UNSPECIFIED is Katib's `tpe` (the local runner's sampler), early stopping its
  `medianstop`; the reverse log scale and resumePreviousJobId have no Katib equivalent
  and are refused.
"""
from __future__ import annotations

import calendar
import json
import os
import queue
import re
import shutil
import shlex
import tempfile
import threading
import time
from typing import Any
from collections.abc import Iterator, Mapping

import kubernetes
import yaml
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from mljob import contracts, machines
from submit import jobs as records
from submit import logs as logfmt
from submit import spec as specs
from submit import tuning_spec
from submit.errors import SubmitError, UsageError
from submit.package import Package, mljob_home
from submit.runners.engine import (ClusterEngine, EngineStatus, Rendered,
                                   ReplicaStatus)

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "tfjobs"
CONTAINER, PORT_NAME, PORT = "tensorflow", "tfjob-port", 2222  # what the operator expects
BASE_IMAGE, BASE_IMAGE_GPU = "tensorflow/tensorflow:2.21.0", "tensorflow/tensorflow:2.21.0-gpu"
MAX_NAME = 50   # pods are <name>-<type>-<index>; their services must stay DNS labels (63)
TIMEOUT_S = 30
POLL_S = 2.0
REPLICA_TYPES = {specs.CHIEF: "Chief", specs.WORKER: "Worker", specs.PS: "PS",
                 specs.EVALUATOR: "Evaluator"}
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
TYPE_LABEL, INDEX_LABEL = "training.kubeflow.org/replica-type", \
    "training.kubeflow.org/replica-index"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

KATIB_VERSION, EXPERIMENTS = "v1beta1", "experiments"
EXPERIMENT = "Experiment"  # the handle's kind for a tuning job (else a TFJob)
# Where a trial's container writes its cloudml-hypertune metrics for Katib's collector.
KATIB_METRICS_FILE = "/var/log/katib/hypertune/output.metrics"
KATIB_ALGORITHMS = {"ALGORITHM_UNSPECIFIED": "tpe", "RANDOM_SEARCH": "random",
                    "GRID_SEARCH": "grid"}
KATIB_TYPES = {"DOUBLE": "double", "INTEGER": "int", "CATEGORICAL": "categorical",
               "DISCRETE": "discrete"}

STATES = {"Created": records.QUEUED, "Suspended": records.QUEUED,
          "Running": records.RUNNING, "Restarting": records.RUNNING,
          "Succeeded": records.SUCCEEDED, "Failed": records.FAILED}


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
    if len(name) > MAX_NAME or not _DNS_LABEL.match(name):
        raise UsageError(f"job id {job_id!r} cannot name a TFJob: with --runner kubeflow "
                         f"use at most {MAX_NAME} characters, ending in a letter or digit")
    return name


def dockerfile(package: Package, gpu: bool) -> str:
    """Install the sdist on TensorFlow's image. The base provides TensorFlow 2.21, so the
    package's own TensorFlow requirement, if it has one, is left out: pip would otherwise
    lay a second TensorFlow (tensorflow-cpu, say) over the base's."""
    dist = package.top_dir.rsplit("-", 1)[0]
    sdist = f"/tmp/{package.file_name}"
    deps = ('import importlib.metadata as m, re, subprocess, sys; '
            f'r = [q for q in m.requires("{dist}") or [] if "extra ==" not in q '
            'and not re.match(r"tensorflow(-cpu|-gpu)?(?![\\w.-])", q)]; '
            'r and subprocess.check_call([sys.executable, "-m", "pip", "install", '
            '"--no-cache-dir", *r])')
    return "\n".join([
        f"# The trainer of {package.file_name} (sha256 {package.sha256[:12]}) on "
        "TensorFlow 2.21.",
        f"FROM {BASE_IMAGE_GPU if gpu else BASE_IMAGE}",
        f"COPY {package.file_name} {sdist}",
        f"RUN pip install --no-cache-dir --no-deps {sdist} \\",
        f" && python -c {shlex.quote(deps)} \\",
        f" && rm {sdist}",
        "WORKDIR /",
        ""])


def build_context(package: Package, gpu: bool) -> str:
    """`$MLJOB_HOME/images/<sha256>/`: the Dockerfile and the sdist, ready for `docker
    build`. Written to a temporary folder and renamed into place, once per package."""
    folder = os.path.join(mljob_home(), "images",
                          package.sha256[:16] + ("-gpu" if gpu else ""))
    if os.path.isdir(folder):
        return folder
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(folder))
    try:
        with open(os.path.join(tmp, "Dockerfile"), "w") as f:
            f.write(dockerfile(package, gpu))
        shutil.copyfile(package.local_file, os.path.join(tmp, package.file_name))
        os.rename(tmp, folder)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isdir(folder):  # not a concurrent build that won the race
            raise
    return folder


class KubeflowEngine(ClusterEngine):
    name = "kubeflow"

    def __init__(self, options):
        super().__init__(options)
        self._clients: dict[str | None, kubernetes.client.ApiClient] = {}

    def prepare(self, spec: specs.JobSpec, package: Package) -> list[str]:
        if not package.local_file:
            return []
        folder = build_context(package, gpu=spec.gpus_needed > 0)
        image = self.options.image or "REGISTRY/mljob-trainer:TAG"
        return [f"The image's build context (Dockerfile and sdist) is {folder}; build "
                f"and push it with:", f"  docker build -t {image} {folder} && "
                f"docker push {image}"]

    def check(self, spec: specs.JobSpec) -> None:
        if not spec.job_dir or not spec.job_dir.startswith("gs://"):
            raise UsageError("--runner kubeflow needs --job-dir gs://BUCKET/PATH: replicas "
                             "run in pods and cannot reach "
                             f"{spec.job_dir or 'a job dir on this machine'}")
        tfjob_name(spec.job_id)
        tuning = _tuning(spec)
        if tuning is not None:
            if tuning.resume_from:
                raise UsageError("trainingInput.hyperparameters.resumePreviousJobId: a "
                                 "Katib Experiment cannot continue an earlier job's study; "
                                 "drop it (or tune with the local runner)")
            reverse = [p.name for p in tuning.params if p.scale == "UNIT_REVERSE_LOG_SCALE"]
            if reverse:
                raise UsageError(f"parameter {reverse[0]!r}: Katib has no "
                                 "UNIT_REVERSE_LOG_SCALE; use UNIT_LOG_SCALE or "
                                 "UNIT_LINEAR_SCALE with --runner kubeflow")
        if self.options.namespace is not None and not _DNS_LABEL.match(
                self.options.namespace):
            raise UsageError(f"--namespace {self.options.namespace!r} is not a Kubernetes "
                             "namespace name; use lower-case letters, digits and '-'")

    def render(self, spec: specs.JobSpec, package: Package) -> Rendered:
        name, namespace = tfjob_name(spec.job_id), self._namespace()
        image = self.options.image or f"mljob-trainer:{package.sha256[:12]}"
        labels = {"app.kubernetes.io/managed-by": "mljob", "mljob/job-id": spec.job_id}
        replica_specs = {}
        for group in spec.groups:
            kind = REPLICA_TYPES[group.task_type]
            if group.task_type == specs.CHIEF and not spec.use_chief:
                kind = "Master"
            replica_specs[kind] = self._replica_spec(spec, group, image, labels)
        most = max((g.max_restarts for g in spec.groups if g.restart_policy != "Never"),
                   default=None)
        run_policy: dict[str, Any] = {"cleanPodPolicy": "Running"}
        if most is not None:
            run_policy["backoffLimit"] = most
        body = {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "TFJob",
            "metadata": {"name": name, "namespace": namespace, "labels": labels,
                         "annotations": {"mljob/package-uri": package.url or "",
                                         "mljob/package-sha256": package.sha256}},
            "spec": {"runPolicy": run_policy, "successPolicy": "",
                     "tfReplicaSpecs": replica_specs}}
        handle = {"name": name, "namespace": namespace, "context": self.options.context,
                  "image_given": self.options.image is not None}
        kind = "TFJob"
        tuning = _tuning(spec)
        if tuning is not None:
            body, kind = experiment(body, tuning, spec.job_dir), EXPERIMENT
            handle["kind"] = EXPERIMENT
        docker = dockerfile(package, gpu=spec.gpus_needed > 0)
        header = [f"# {kind} for mljob job " + spec.job_id + "; apply it with "
                  "`kubectl apply -f -` or submit without --dry-run.",
                  f"# Every replica runs --image {image}, built from the staged "
                  f"package {package.file_name} with this Dockerfile:", "#"]
        header += [f"#   {line}" for line in docker.rstrip("\n").splitlines()]
        text = "\n".join(header) + "\n" + yaml.safe_dump(body, sort_keys=False,
                                                         default_flow_style=False)
        return Rendered(body=body, text=text, handle=handle)

    def _replica_spec(self, spec, group, image, labels) -> dict:
        container = {
            "name": CONTAINER, "image": image,
            "command": ["python", "-m", spec.module_name],
            "args": list(spec.trainer_args),
            "env": [{"name": contracts.JOB_ID_ENV, "value": spec.job_id},
                    {"name": "PYTHONUNBUFFERED", "value": "1"}],
            "ports": [{"name": PORT_NAME, "containerPort": PORT}]}
        config = spec.training_input.get(specs.CONFIG_KEYS[group.task_type]) or {}
        accelerator_config = config.get("acceleratorConfig") or {}
        container["resources"] = resources(group, accelerator_config.get("count", 0))
        pod: dict[str, Any] = {"containers": [container]}
        if self.options.service_account:
            pod["serviceAccountName"] = self.options.service_account
        accelerator = accelerator_config.get("type")
        if accelerator and group.gpus:
            pod["nodeSelector"] = {"cloud.google.com/gke-accelerator":
                                   accelerator.lower().replace("_", "-")}
        return {"replicas": group.count, "restartPolicy": group.restart_policy,
                "template": {"metadata": {"labels": dict(labels)}, "spec": pod}}

    def _namespace(self) -> str:
        if self.options.namespace:
            return self.options.namespace
        try:
            _, current = kubernetes.config.list_kube_config_contexts(_kubeconfig())
            context = current
            if self.options.context:
                contexts, _ = kubernetes.config.list_kube_config_contexts(_kubeconfig())
                context = next((c for c in contexts if c["name"] == self.options.context),
                               current)
            return (context or {}).get("context", {}).get("namespace") or "default"
        except (kubernetes.config.ConfigException, OSError, TypeError):
            return "default"

    # -- talking to the cluster -------------------------------------------------------

    def _client(self, handle: Mapping[str, Any]) -> kubernetes.client.ApiClient:
        """The kubeconfig's client (its current context, or the job's), else the pod's
        own service account when running inside a cluster."""
        context = handle.get("context") or self.options.context
        if context in self._clients:  # one client (and connection pool) per context
            return self._clients[context]
        try:
            client = kubernetes.config.new_client_from_config(_kubeconfig(),
                                                              context=context)
            self._clients[context] = client
            return client
        except (kubernetes.config.ConfigException, OSError) as exc:
            if os.environ.get("KUBERNETES_SERVICE_HOST") and not context:
                kubernetes.config.load_incluster_config()
                return kubernetes.client.ApiClient()
            raise UsageError(f"no usable kubeconfig ({_one_line(exc)}); point KUBECONFIG "
                             "at your cluster's config or pick one with --kube-context") \
                from None

    def ready(self, rendered: Rendered) -> None:
        if not rendered.handle.get("image_given", True):
            raise UsageError("--runner kubeflow needs --image REGISTRY/NAME:TAG, an image "
                             "holding the trainer; build and push one from the Dockerfile "
                             "that --dry-run prints")

    def create(self, rendered: Rendered) -> Mapping[str, Any]:
        self.ready(rendered)
        handle = dict(rendered.handle)
        handle.pop("image_given", None)
        api = kubernetes.client.CustomObjectsApi(self._client(handle))
        version, plural = _resource(handle)
        with _api_errors(handle, f"create the {handle.get('kind', 'TFJob')}"):
            created = api.create_namespaced_custom_object(
                GROUP, version, handle["namespace"], plural, dict(rendered.body),
                _request_timeout=TIMEOUT_S)
        handle["uid"] = (created.get("metadata") or {}).get("uid")
        if not handle.get("context"):
            try:
                _, current = kubernetes.config.list_kube_config_contexts(_kubeconfig())
                handle["context"] = (current or {}).get("name")
            except (kubernetes.config.ConfigException, OSError, TypeError):
                pass  # in-cluster config has no contexts
        return handle

    def status(self, handle: Mapping[str, Any]) -> EngineStatus:
        client = self._client(handle)
        api = kubernetes.client.CustomObjectsApi(client)
        try:
            version, plural = _resource(handle)
            with _api_errors(handle, f"read the {handle.get('kind', 'TFJob')}"):
                job = api.get_namespaced_custom_object(
                    GROUP, version, handle["namespace"], plural, handle["name"],
                    _request_timeout=TIMEOUT_S)
        except _Gone:
            return EngineStatus(records.CANCELLED, f"the {handle.get('kind', 'TFJob')} "
                                f"{handle['name']} is gone "
                                f"from namespace {handle['namespace']} (deleted)")
        state, message = records.QUEUED, None
        for condition in (job.get("status") or {}).get("conditions") or []:
            if condition.get("status") == "True" and condition.get("type") in STATES:
                state = STATES[condition["type"]]
                message = condition.get("message") if state == records.FAILED else None
        return EngineStatus(state, message, tuple(
            _replica_status(pod) for pod in self._pods(client, handle)))

    def _pods(self, client, handle) -> list:
        core = kubernetes.client.CoreV1Api(client)
        with _api_errors(handle, "list the job's pods"):
            pods = core.list_namespaced_pod(
                handle["namespace"], label_selector=f"{JOB_NAME_LABEL}={handle['name']}",
                _request_timeout=TIMEOUT_S).items
        return sorted(pods, key=_label)

    def logs(self, handle: Mapping[str, Any], *, task_name: str | None = None,
             follow: bool = True) -> Iterator[str]:
        """Each container's log once, from its start, labelled by replica: one reader
        thread per running container; a restarted container is a new one."""
        if task_name and contracts.parse_label(task_name) is None:
            raise UsageError(f"--task-name {task_name!r} names no replica; use "
                             f"{contracts.LABEL_HINT}")
        client = self._client(handle)
        core = kubernetes.client.CoreV1Api(client)
        lines: queue.Queue = queue.Queue()
        readers: dict[tuple[str, int], threading.Thread] = {}
        while True:
            # the state first: a pod that ends between the two reads is still read below
            done = not follow or self.status(handle).state in records.FINAL_STATES
            for pod in self._pods(client, handle):
                label = _label(pod)
                # a pod the operator re-creates has the same name and a new uid
                key = (pod.metadata.uid or pod.metadata.name, _restarts(pod))
                if (task_name and label != task_name) or key in readers or \
                        not _started(pod):
                    continue
                reader = threading.Thread(
                    target=_read_log, daemon=True,
                    args=(core, handle["namespace"], pod.metadata.name, label,
                          follow and pod.status.phase == "Running", lines))
                readers[key] = reader
                reader.start()
            deadline = time.monotonic() + (TIMEOUT_S if done else POLL_S)
            while time.monotonic() < deadline:
                try:
                    yield lines.get(timeout=0.2)
                except queue.Empty:
                    if done and not any(r.is_alive() for r in readers.values()):
                        break
            if done:
                while not lines.empty():
                    yield lines.get()
                return

    def cancel(self, handle: Mapping[str, Any]) -> str:
        api = kubernetes.client.CustomObjectsApi(self._client(handle))
        version, plural = _resource(handle)
        try:  # an Experiment's trials and their TFJobs are its children: deleted with it
            with _api_errors(handle, f"delete the {handle.get('kind', 'TFJob')}"):
                api.delete_namespaced_custom_object(
                    GROUP, version, handle["namespace"], plural, handle["name"],
                    propagation_policy="Foreground", _request_timeout=TIMEOUT_S)
        except _Gone:
            pass  # already deleted: cancelled all the same
        return records.CANCELLED


def _resource(handle: Mapping[str, Any]) -> tuple[str, str]:
    """(API version, plural) of the handle's object: a TFJob or a Katib Experiment."""
    if handle.get("kind") == EXPERIMENT:
        return KATIB_VERSION, EXPERIMENTS
    return VERSION, PLURAL


def _tuning(spec: specs.JobSpec) -> tuning_spec.TuningSpec | None:
    hp = spec.training_input.get("hyperparameters")
    return None if hp is None else tuning_spec.parse(hp, job_dir=spec.job_dir)


def experiment(tfjob: Mapping[str, Any], tuning: tuning_spec.TuningSpec,
               job_dir: str) -> dict:
    """The Katib Experiment around a rendered TFJob (see the module docstring)."""
    trial_job = json.loads(json.dumps(tfjob))
    metadata = trial_job.pop("metadata")
    trial_job["metadata"] = {"labels": metadata["labels"]}  # Katib names each trial
    trial_env = [{"name": contracts.TRIAL_ID_ENV, "value": "${trialSpec.Name}"},
                 {"name": contracts.HP_METRIC_TAG_ENV, "value": tuning.metric_tag},
                 {"name": contracts.HP_METRIC_FILE_ENV, "value": KATIB_METRICS_FILE}]
    flags = [f"--{p.name}=${{trialParameters.{p.name}}}" for p in tuning.params]
    for replica in trial_job["spec"]["tfReplicaSpecs"].values():
        container = replica["template"]["spec"]["containers"][0]
        args = list(container["args"])
        if len(args) >= 2 and args[-2] == "--job-dir":
            args = args[:-2]
        container["args"] = args + flags + ["--job-dir", f"{job_dir}/${{trialSpec.Name}}"]
        container["env"] = container["env"] + trial_env
    parameters = []
    for p in tuning.params:
        if p.type in ("DOUBLE", "INTEGER"):
            space = {"min": str(p.low), "max": str(p.high), "distribution":
                     "logUniform" if p.scale == "UNIT_LOG_SCALE" else "uniform"}
        else:
            space = {"list": [str(v) for v in p.values]}
        parameters.append({"name": p.name, "parameterType": KATIB_TYPES[p.type],
                           "feasibleSpace": space})
    spec: dict[str, Any] = {
        "objective": {"type": "maximize" if tuning.maximize else "minimize",
                      "objectiveMetricName": tuning.metric_tag},
        "algorithm": {"algorithmName": KATIB_ALGORITHMS[tuning.algorithm]},
        "parallelTrialCount": tuning.max_parallel_trials,
        "maxTrialCount": tuning.max_trials,
        "parameters": parameters,
        "metricsCollectorSpec": {
            "collector": {"kind": "File"},
            "source": {"fileSystemPath": {"path": KATIB_METRICS_FILE, "kind": "File",
                                          "format": "JSON"}}},
        "trialTemplate": {
            "primaryContainerName": CONTAINER,
            "primaryPodLabels": {"training.kubeflow.org/job-role": "master"},
            "successCondition": 'status.conditions.#(type=="Succeeded")#|#(status=="True")#',
            "failureCondition": 'status.conditions.#(type=="Failed")#|#(status=="True")#',
            "trialParameters": [{"name": p.name, "reference": p.name,
                                 "description": f"--{p.name}"} for p in tuning.params],
            "trialSpec": trial_job}}
    if tuning.max_failed_trials:
        spec["maxFailedTrialCount"] = tuning.max_failed_trials
    if tuning.early_stopping:
        spec["earlyStopping"] = {"algorithmName": "medianstop", "algorithmSettings": [
            {"name": "min_trials_required", "value": "2"}]}
    body = {"apiVersion": f"{GROUP}/{KATIB_VERSION}", "kind": EXPERIMENT,
            "metadata": metadata, "spec": spec}
    return json.loads(json.dumps(body))  # no shared objects: YAML would alias them


class _Gone(SubmitError):
    """The TFJob is not there (404 on a named object)."""


class _api_errors:
    """Turn the client's exceptions into one-line errors that say what to do."""

    def __init__(self, handle: Mapping[str, Any], doing: str):
        self.handle, self.doing = handle, doing

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None:
            return False
        where = f"namespace {self.handle['namespace']}"
        if isinstance(exc, ApiException):
            reason = _reason(exc)
            if exc.status == 404 and self.doing.startswith("create"):
                if "namespace" in reason.lower():
                    raise UsageError(f"{where} does not exist; create it (kubectl create "
                                     "namespace ...) or pass another --namespace") from None
                if self.handle.get("kind") == EXPERIMENT:
                    raise SubmitError(f"the cluster has no Experiment resource ({GROUP}/"
                                      f"{KATIB_VERSION}); install Katib") from None
                raise SubmitError(f"the cluster has no TFJob resource ({GROUP}/{VERSION}); "
                                  "install the Kubeflow Training Operator") from None
            if exc.status == 404:
                raise _Gone(reason) from None
            if exc.status == 409:
                raise SubmitError(f"a {self.handle.get('kind', 'TFJob')} named "
                                  f"{self.handle['name']} already exists in "
                                  f"{where}; cancel it or pick another job id") from None
            if exc.status in (401, 403):
                raise SubmitError(f"cannot {self.doing} in {where}: {reason}; check your "
                                  "kubeconfig's credentials and RBAC rights") from None
            raise SubmitError(f"cannot {self.doing} in {where}: HTTP {exc.status} "
                              f"{reason}") from None
        if isinstance(exc, (HTTPError, OSError)):
            raise SubmitError(f"cannot reach the Kubernetes API to {self.doing} "
                              f"({_one_line(exc)}); check the cluster is up and the "
                              "kubeconfig's server address") from None
        return False


def _kubeconfig() -> str:
    """KUBECONFIG as it is now (the client reads it once, when it is imported)."""
    return os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


def _reason(exc: ApiException) -> str:
    try:
        return json.loads(exc.body).get("message") or exc.reason
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def _label(pod) -> str:
    labels = pod.metadata.labels or {}
    kind, index = labels.get(TYPE_LABEL, "?"), labels.get(INDEX_LABEL, "0")
    if kind.lower() in contracts.LABEL_KINDS:  # the operator's replica type, lower-cased
        return contracts.replica_label(kind.lower(), index)
    return f"{kind}-replica-{index}"


def _started(pod) -> bool:
    """The container runs or ran: it has a log to read (a waiting one has none yet)."""
    for status in pod.status.container_statuses or []:
        if status.name == CONTAINER and status.state:
            return bool(status.state.running or status.state.terminated)
    return False


def _restarts(pod) -> int:
    statuses = pod.status.container_statuses or []
    return sum(s.restart_count or 0 for s in statuses if s.name == CONTAINER)


def _replica_status(pod) -> ReplicaStatus:
    phase = pod.status.phase or "Unknown"
    exit_code = None
    for status in pod.status.container_statuses or []:
        terminated = status.state and status.state.terminated
        if status.name == CONTAINER and terminated:
            exit_code = terminated.exit_code
    state = {"Pending": "PENDING", "Running": "RUNNING", "Succeeded": "EXITED",
             "Failed": "FAILED"}.get(phase, phase.upper())
    return ReplicaStatus(_label(pod), state, exit_code, _restarts(pod))


def _read_log(core, namespace: str, pod: str, label: str, follow: bool,
              out: queue.Queue) -> None:
    try:
        response = core.read_namespaced_pod_log(
            pod, namespace, container=CONTAINER, follow=follow, timestamps=True,
            _preload_content=False)
        pending = b""
        for chunk in response.stream(decode_content=True):  # chunks, not lines
            *complete, pending = (pending + chunk).split(b"\n")
            for line in complete:
                out.put(_format(label, line.decode("utf-8", "replace")))
        if pending:
            out.put(_format(label, pending.decode("utf-8", "replace")))
        response.release_conn()
    except (ApiException, HTTPError, OSError) as exc:
        out.put(logfmt.format_line(label, f"(log unavailable: {_one_line(exc)})",
                                   "WARNING"))


def _format(label: str, line: str) -> str:
    """`2026-11-22T10:00:00.123456789Z text` (the API's timestamps) as the local
    runner's log lines."""
    stamp, _, text = line.partition(" ")
    try:
        when = calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return logfmt.format_line(label, line)
    return logfmt.format_line(label, text, logfmt.severity(text, "stderr"), when)
