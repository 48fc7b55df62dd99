"""`--runner kubeflow`: the job as a Kubeflow Training Operator TFJob, on the cluster of
the current kubeconfig (or `--kube-context`).

What the TFJob holds, and why, is `submit.runners.kubeflow_render` (pure: no cluster
calls); with `--api jobset` the job is a JobSet instead (`submit.runners.kubeflow_jobset`),
created, followed and deleted the same way. This module is the engine: it checks what
only a cluster needs (a gs:// job dir: pods cannot see this machine's files or
memory://), and creates, follows, reads the logs of and deletes the TFJob (or JobSet)
through the kubernetes client.

A batch prediction job is a `batch/v1` Indexed Job and a ConfigMap of its shard plan
(`submit.runners.kubeflow_batch`), created, followed and deleted the same way.

A tuning job (`trainingInput.hyperparameters`) is a Katib Experiment
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
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from mljob import contracts
from submit import jobs as records
from submit import logs as logfmt
from submit.jobdef import engine_keys, spec as specs
from submit.errors import SubmitError, UsageError
from submit.packaging.package import Package
from submit.prediction.spec import PredictionSpec
from submit.runners import kubeflow_batch, kubeflow_jobset, kubeflow_render
from submit.runners.kubeflow_katib import (  # noqa: F401 - the engine's names, as before
    EXPERIMENT, EXPERIMENTS, KATIB_ALGORITHMS, KATIB_METRICS_FILE, KATIB_TYPES,
    KATIB_VERSION, experiment)
from submit.runners.engine import (ClusterEngine, EngineOptions, EngineStatus, Rendered,
                                   ReplicaStatus)
from submit.runners.kubeflow_render import (  # noqa: F401 - the engine's names, as before
    BASE_IMAGE, BASE_IMAGE_GPU, CONTAINER, DNS_LABEL, GROUP, MAX_NAME, PLURAL, PORT,
    PORT_NAME, REPLICA_TYPES, VERSION, build_context, dockerfile, machine_resources,
    resources, tfjob_name)

TIMEOUT_S = 30
POLL_S = 2.0
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
TYPE_LABEL, INDEX_LABEL = "training.kubeflow.org/replica-type", \
    "training.kubeflow.org/replica-index"

SERVICE_ACCOUNT = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # fullmatch
STATE_OF = {kubeflow_jobset.KIND: kubeflow_jobset.state_of,
            kubeflow_batch.KIND: kubeflow_batch.state_of}
STATES = {"Created": records.QUEUED, "Suspended": records.QUEUED,
          "Running": records.RUNNING, "Restarting": records.RUNNING,
          "Succeeded": records.SUCCEEDED, "Failed": records.FAILED}


class KubeflowEngine(ClusterEngine):
    name = "kubeflow"

    def __init__(self, options: EngineOptions) -> None:
        super().__init__(options)
        self._clients: dict[str | None, kubernetes.client.ApiClient] = {}

    @staticmethod
    def _build_context(spec: specs.JobSpec, package: Package | None,
                       image: str | None) -> list[str]:
        """Write the image's build context on this machine (a Dockerfile and the
        packages); the lines telling the user what to do with it."""
        if package is None or not package.local_file:  # custom containers: no build
            return []
        remote = [p.file_name for p in package.all if not p.local_file]
        if remote:  # a dry run leaves staged archives where they are
            return [f"The image's build context is written when the job is submitted (a dry "
                    f"run does not download {', '.join(remote)})"]
        folder = build_context(package, gpu=spec.gpus_needed > 0)
        image = image or "REGISTRY/mljob-trainer:TAG"
        return [f"The image's build context (Dockerfile and packages) is {folder}; build "
                f"and push it with:", f"  docker build -t {image} {folder} && "
                f"docker push {image}"]

    def check(self, spec: specs.JobSpec) -> None:
        if not spec.job_dir or not spec.job_dir.startswith("gs://"):
            raise UsageError("--runner kubeflow needs --job-dir gs://BUCKET/PATH: replicas "
                             "run in pods and cannot reach "
                             f"{spec.job_dir or 'a job dir on this machine'}")
        tfjob_name(spec.job_id)
        kubeflow_render.check_labels(spec)
        if spec.custom_containers and self.options.image is not None:
            raise UsageError("--image names the image a package is installed in; custom "
                             "containers name theirs with --master-image-uri (imageUri): "
                             "drop --image")
        tuning = spec.tuning
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
        if self.options.namespace is not None and not DNS_LABEL.fullmatch(
                self.options.namespace):
            raise UsageError(f"--namespace {self.options.namespace!r} is not a Kubernetes "
                             "namespace name; use lower-case letters, digits and '-'")
        self._check_engine_keys(spec)

    def _check_engine_keys(self, spec: specs.JobSpec) -> None:
        """--api, --queue, the service account, and config.yaml's engine keys."""
        queue = getattr(self.options, "queue", None)
        if queue is not None and not engine_keys.QUEUE_NAME.fullmatch(queue):
            raise UsageError(f"--queue {queue!r} is not a queue name; use "
                             f"{engine_keys.QUEUE_HINT}")
        account = self._service_account(spec)
        if account is not None and not SERVICE_ACCOUNT.fullmatch(account):
            where = "--service-account" if self.options.service_account else \
                "trainingInput.serviceAccount"
            raise UsageError(f"{where} {account!r:.80} is not a Kubernetes service "
                             "account name; use lower-case letters, digits, '-' and '.' "
                             "(a Google service account email is for --runner vertex)")
        if spec.engine.strategy == "FLEX_START":
            raise UsageError("trainingInput.scheduling.strategy FLEX_START is Vertex AI's; "
                             "with --runner kubeflow use SPOT or STANDARD (flex-start node "
                             "pools are the cluster's choice)")
        vertex_only = spec.engine.given("network", "tensorboard", "enable_web_access",
                                        "base_output_directory")
        if vertex_only:
            raise UsageError(f"trainingInput.{vertex_only[0]} is for --runner vertex; "
                             "drop it for --runner kubeflow")
        if self._api() == "jobset":
            kubeflow_jobset.check(spec, tfjob_name(spec.job_id))

    def _api(self) -> str:
        return getattr(self.options, "api", None) or "tfjob"

    def _service_account(self, spec: specs.JobSpec) -> str | None:
        return self.options.service_account or spec.engine.service_account

    def render(self, spec: specs.JobSpec, package: Package | None) -> Rendered:
        name, namespace = tfjob_name(spec.job_id), self._namespace()
        image = self.options.image or (f"mljob-trainer:{package.sha256[:12]}" if package
                                       else "")
        queue = getattr(self.options, "queue", None) or spec.engine.queue_name
        render = kubeflow_jobset.jobset if self._api() == "jobset" else \
            kubeflow_render.tfjob
        body = render(spec, package, name=name, namespace=namespace, image=image,
                      service_account=self._service_account(spec), queue=queue)
        handle = {"name": name, "namespace": namespace, "context": self.options.context}
        blocked = None
        if self.options.image is None and not spec.custom_containers:
            blocked = ("--runner kubeflow needs --image REGISTRY/NAME:TAG, an image "
                       "holding the trainer; build and push one from the Dockerfile "
                       "that --dry-run prints")
        kind = "TFJob"
        if self._api() == "jobset":
            kind = handle["kind"] = kubeflow_jobset.KIND
        tuning = spec.tuning
        if tuning is not None:
            assert spec.job_dir is not None  # check() asked for a gs:// job dir
            body, kind = experiment(body, tuning, spec.job_dir), EXPERIMENT
            handle["kind"] = EXPERIMENT
        return Rendered(body=body, handle=handle, text=kubeflow_render.dry_run_text(
            spec, package, body, image, kind=kind), blocked=blocked,
            notes=tuple(self._build_context(spec, package, self.options.image)))

    def render_prediction(self, spec: PredictionSpec) -> Rendered:
        return kubeflow_batch.render(spec, self.options)  # an Indexed Job, its plan

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

    def create(self, rendered: Rendered) -> Mapping[str, Any]:
        if rendered.blocked:
            raise UsageError(rendered.blocked)
        handle = dict(rendered.handle)
        if handle.get("kind") == kubeflow_batch.KIND:
            handle["uid"] = kubeflow_batch.create(self._client(handle), rendered,
                                                  _api_errors)
        else:
            api = kubernetes.client.CustomObjectsApi(self._client(handle))
            group, version, plural = _resource(handle)
            with _api_errors(handle, f"create the {handle.get('kind', 'TFJob')}"):
                created = api.create_namespaced_custom_object(
                    group, version, handle["namespace"], plural, dict(rendered.body),
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
            if handle.get("kind") == kubeflow_batch.KIND:
                job = kubeflow_batch.read(client, handle, _api_errors)
            else:
                group, version, plural = _resource(handle)
                with _api_errors(handle, f"read the {handle.get('kind', 'TFJob')}"):
                    job = api.get_namespaced_custom_object(
                        group, version, handle["namespace"], plural, handle["name"],
                        _request_timeout=TIMEOUT_S)
        except _Gone:
            return EngineStatus(records.CANCELLED, f"the {handle.get('kind', 'TFJob')} "
                                f"{handle['name']} is gone "
                                f"from namespace {handle['namespace']} (deleted)")
        state, message = records.QUEUED, None
        if handle.get("kind") in STATE_OF:  # a JobSet, a batch prediction Job
            state, message = STATE_OF[handle["kind"]](job)
        else:
            for condition in (job.get("status") or {}).get("conditions") or []:
                if condition.get("status") == "True" and condition.get("type") in STATES:
                    state = STATES[condition["type"]]
                    message = condition.get("message") if state == records.FAILED \
                        else None
        return EngineStatus(state, message, tuple(
            _replica_status(pod) for pod in self._pods(client, handle)))

    def _pods(self, client, handle) -> list:
        core = kubernetes.client.CoreV1Api(client)
        with _api_errors(handle, "list the job's pods"):
            label = {kubeflow_jobset.KIND: kubeflow_jobset.JOBSET_NAME_LABEL,
                     kubeflow_batch.KIND: kubeflow_batch.NAME_LABEL}.get(
                handle.get("kind", ""), JOB_NAME_LABEL)
            pods = core.list_namespaced_pod(
                handle["namespace"], label_selector=f"{label}={handle['name']}",
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
        container = kubeflow_batch.CONTAINER if handle.get("kind") == kubeflow_batch.KIND \
            else CONTAINER
        readers: dict[tuple[str, int], threading.Thread] = {}
        while True:
            # the state first: a pod that ends between the two reads is still read below
            done = not follow or self.status(handle).state in records.FINAL_STATES
            for pod in self._pods(client, handle):
                label = _label(pod)
                # a pod the operator re-creates has the same name and a new uid
                key = (pod.metadata.uid or pod.metadata.name, _restarts(pod))
                if (task_name and label != task_name) or key in readers or \
                        not _started(pod, container):
                    continue
                reader = threading.Thread(
                    target=_read_log, daemon=True,
                    args=(core, handle["namespace"], pod.metadata.name, label, container,
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

    def update_labels(self, record: records.JobRecord, old: Mapping[str, str],
                      new: Mapping[str, str]) -> str | None:
        """The TFJob's (or Experiment's) labels, by a merge patch: removed keys are set to
        null, mljob's own labels are left as they are. Running pods keep theirs."""
        handle = record.engine
        if handle.get("kind") == kubeflow_batch.KIND:
            return "a batch prediction Job keeps its labels; they are changed in its record"
        api = kubernetes.client.CustomObjectsApi(self._client(handle))
        group, version, plural = _resource(handle)
        body = {"metadata": {"labels": {**{k: None for k in old if k not in new}, **new}}}
        kind = handle.get("kind", "TFJob")
        try:
            with _api_errors(handle, f"update the {kind}'s labels"):
                api.patch_namespaced_custom_object(
                    group, version, handle["namespace"], plural, handle["name"], body,
                    _request_timeout=TIMEOUT_S)
        except _Gone:
            return (f"the {kind} {handle['name']} is gone from namespace "
                    f"{handle['namespace']}; the labels are changed in the job's record")
        return None

    def cancel(self, handle: Mapping[str, Any]) -> str:
        if handle.get("kind") == kubeflow_batch.KIND:  # the Job's pods go with it
            kubeflow_batch.delete(self._client(handle), handle, _api_errors, _Gone)
            return records.CANCELLED
        api = kubernetes.client.CustomObjectsApi(self._client(handle))
        group, version, plural = _resource(handle)
        try:  # an Experiment's trials and their TFJobs are its children: deleted with it
            with _api_errors(handle, f"delete the {handle.get('kind', 'TFJob')}"):
                api.delete_namespaced_custom_object(
                    group, version, handle["namespace"], plural, handle["name"],
                    propagation_policy="Foreground", _request_timeout=TIMEOUT_S)
        except _Gone:
            pass  # already deleted: cancelled all the same
        return records.CANCELLED


def _resource(handle: Mapping[str, Any]) -> tuple[str, str, str]:
    """(API group, version, plural) of the handle's object: a TFJob, a Katib
    Experiment or a JobSet."""
    if handle.get("kind") == EXPERIMENT:
        return GROUP, KATIB_VERSION, EXPERIMENTS
    if handle.get("kind") == kubeflow_jobset.KIND:
        return kubeflow_jobset.GROUP, kubeflow_jobset.VERSION, kubeflow_jobset.PLURAL
    return GROUP, VERSION, PLURAL


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
                if self.handle.get("kind") == kubeflow_jobset.KIND:
                    raise SubmitError("the cluster has no JobSet resource "
                                      f"({kubeflow_jobset.GROUP}/{kubeflow_jobset.VERSION}); "
                                      "install JobSet (kubernetes-sigs/jobset)") from None
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
    found = kubeflow_jobset.pod_label(labels) or kubeflow_batch.pod_label(labels)
    if TYPE_LABEL not in labels and found:  # a JobSet's pod, or a batch prediction Job's
        return found
    kind, index = labels.get(TYPE_LABEL, "?"), labels.get(INDEX_LABEL, "0")
    if kind.lower() in contracts.LABEL_KINDS:  # the operator's replica type, lower-cased
        return contracts.replica_label(kind.lower(), index)
    return f"{kind}-replica-{index}"


def _started(pod, container: str = CONTAINER) -> bool:
    """The container runs or ran: it has a log to read (a waiting one has none yet)."""
    for status in pod.status.container_statuses or []:
        if status.name == container and status.state:
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
        if status.name in (CONTAINER, kubeflow_batch.CONTAINER) and terminated:
            exit_code = terminated.exit_code
    state = {"Pending": "PENDING", "Running": "RUNNING", "Succeeded": "EXITED",
             "Failed": "FAILED"}.get(phase, phase.upper())
    return ReplicaStatus(_label(pod), state, exit_code, _restarts(pod))


def _read_log(core, namespace: str, pod: str, label: str, container: str, follow: bool,
              out: queue.Queue) -> None:
    try:
        response = core.read_namespaced_pod_log(
            pod, namespace, container=container, follow=follow, timestamps=True,
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
