"""The job as a JobSet (kubernetes-sigs/jobset, `jobset.x-k8s.io/v1alpha2`), chosen with
`--runner kubeflow --api jobset`: pure rendering, as `kubeflow_render` is for the TFJob.

The TFJob's operator (the Kubeflow training-operator) is no longer maintained; JobSet is
Kubernetes' own API for a group of Jobs that run as one, and what Kueue queues. What the
operator did for us, the JobSet says itself:

- One replicatedJob per replica type (`chief` or, under Cloud ML's legacy name,
  `master`; `worker`, `ps`, `evaluator`), with `replicas` = the type's count: one Job
  per replica, each of one pod (Indexed, completions = parallelism = 1), so that a
  replica's restarts are its own Job's.
- TF_CONFIG is in the manifest: JobSet gives every pod the stable host name
  `<jobset>-<rjob>-<jobIndex>-<podIndex>.<subdomain>` (`network.enableDNSHostnames`,
  subdomain = the JobSet's name, a headless service JobSet creates). The cluster lists
  every chief, worker and ps at port 2222 (the evaluator is not in it, as TensorFlow
  wants); the task index is the pod's Job index, read from its label
  `jobset.sigs.k8s.io/job-index` by the downward API into MLJOB_REPLICA_INDEX, which the
  kubelet substitutes for `$(MLJOB_REPLICA_INDEX)` in TF_CONFIG's value. Every other
  `$` of the value is written `$$`, which the kubelet makes `$` again.
- Success: `successPolicy: {operator: All, targetReplicatedJobs: [chief]}`: the job
  succeeds when the chief does, as a TFJob's does. JobSet then deletes the Jobs still
  running (ps, workers, the evaluator, whose pod keeps its grace period for one last
  evaluation), so none outlives the job.
- Restarts are per replica, as Cloud ML's `maxRestarts` counts them: the Job's
  `backoffLimit` is the type's maxRestarts. OnFailure (and Always, which a Job cannot
  have: a ps or worker that exits 0 is done) restart the container in place
  (`restartPolicy: OnFailure`); ExitCode is the TFJob's rule as a `podFailurePolicy`:
  exit codes 1-127 are permanent (the Job fails at once), others (signals, 128-255) make
  a new pod; Never is `backoffLimit: 0`. A replica out of restarts fails its Job, and the
  JobSet's `failurePolicy` (maxRestarts 0, one FailJobSet rule) fails the whole job:
  JobSet's own restart recreates every replica and counts one budget for them all, which
  is not Cloud ML's per-replica maxRestarts.
- `scheduling.maxRunningTime` is each Job's `activeDeadlineSeconds`; a JobSet has no
  wait limit, so `maxWaitTime` is refused (Kueue's waitForPodsReady is the cluster's).
- A Kueue queue (`--queue`, `scheduling.queueName`) is the label
  `kueue.x-k8s.io/queue-name`, and the JobSet is created suspended for Kueue to admit;
  `scheduling.ttlAfterFinished` is `ttlSecondsAfterFinished`.
"""
from __future__ import annotations

import json
import math
from typing import Any

from mljob import contracts
from submit import jobs as records
from submit.jobdef import spec as specs
from submit.errors import UsageError
from submit.packaging.package import Package
from submit.runners import kubeflow_render as render

GROUP, VERSION, PLURAL, KIND = "jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet"
QUEUE_LABEL = render.QUEUE_LABEL
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
RJOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
INDEX_ENV = "MLJOB_REPLICA_INDEX"
PORT_NAME = "tf-grpc"  # TensorFlow's gRPC server, at render.PORT as on a TFJob
PERMANENT_EXIT_CODES = list(range(1, 128))  # the TFJob's ExitCode policy: 128+ retry
MAX_POD_NAME = 63  # a DNS label; JobSet's webhook adds "-abcde" for the pod's suffix


def rjob_name(spec: specs.JobSpec, task_type: str) -> str:
    """The replicated job of a type: TF_CONFIG's name for it."""
    if task_type == specs.CHIEF:
        return specs.CHIEF if spec.use_chief else specs.MASTER
    return task_type


def host(name: str, rjob: str, index: int) -> str:
    """A replica's stable address: `<jobset>-<rjob>-<jobIndex>-<podIndex>.<subdomain>`."""
    return f"{name}-{rjob}-{index}-0.{name}:{render.PORT}"


def check(spec: specs.JobSpec, name: str) -> None:
    """What a JobSet cannot take, before anything is built."""
    for group in spec.groups:
        longest = f"{name}-{rjob_name(spec, group.task_type)}-{group.count - 1}-0-abcde"
        if len(longest) > MAX_POD_NAME:
            raise UsageError(f"job id {spec.job_id!r} is too long for a JobSet of "
                             f"{group.count} {group.task_type} replicas (pod name "
                             f"{longest} is over {MAX_POD_NAME} characters); use a job "
                             f"id of at most {len(name) - len(longest) + MAX_POD_NAME} "
                             "characters")
    if spec.max_wait_time is not None:
        raise UsageError("trainingInput.scheduling.maxWaitTime: a JobSet has no wait "
                         "limit; drop it, or use --api tfjob (gang scheduling)")
    if spec.tuning is not None:
        raise UsageError("a tuning job (trainingInput.hyperparameters) is a Katib "
                         "Experiment of TFJobs; submit it with --api tfjob")


def tf_config(spec: specs.JobSpec, name: str, task_type: str) -> str:
    """TF_CONFIG's value for the type's pods, with `$(MLJOB_REPLICA_INDEX)` for the
    index (see the module docstring)."""
    cluster = {rjob_name(spec, t): [host(name, rjob_name(spec, t), i)
                                    for i in range(spec.count(t))]
               for t in (specs.CHIEF, specs.WORKER, specs.PS) if spec.count(t)}
    mark = "\x00index\x00"
    text = json.dumps({"cluster": cluster,
                       "task": {"type": rjob_name(spec, task_type), "index": mark},
                       "job": dict(spec.training_input), "environment": "cloud"},
                      sort_keys=True)
    return text.replace("$", "$$").replace(json.dumps(mark), f"$({INDEX_ENV})")


def jobset(spec: specs.JobSpec, package: Package | None, *, name: str, namespace: str,
           image: str, service_account: str | None = None,
           queue: str | None = None) -> dict:
    """The JobSet as the API takes it."""
    labels = {**spec.labels, "app.kubernetes.io/managed-by": "mljob",
              "mljob/job-id": spec.job_id}
    replicated = [replicated_job(spec, group, name, image, labels, service_account)
                  for group in spec.groups]
    chief = rjob_name(spec, specs.CHIEF)
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
        "metadata": {"name": name, "namespace": namespace,  # the queue: the JobSet's only
                     "labels": {**labels, QUEUE_LABEL: queue} if queue else labels,
                     "annotations": {"mljob/package-uri": package.url or "",
                                     "mljob/package-sha256": package.sha256}
                     if package else {}},
        "spec": {
            "network": {"enableDNSHostnames": True, "subdomain": name,
                        "publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [chief]},
            "failurePolicy": {"maxRestarts": 0, "rules": [
                {"name": "ReplicaOutOfRestarts", "action": "FailJobSet"}]},
            "replicatedJobs": replicated}}
    if queue:
        body["spec"]["suspend"] = True  # Kueue admits it by resuming it
    ttl = spec.engine.ttl_seconds
    if ttl is not None:
        body["spec"]["ttlSecondsAfterFinished"] = ttl
    return body


def replicated_job(spec: specs.JobSpec, group: specs.ReplicaGroup, name: str, image: str,
                   labels: dict, service_account: str | None) -> dict:
    replica = render.replica_spec(spec, group, image, labels, service_account)
    template = replica["template"]
    pod = template["spec"]
    (container,) = pod["containers"]
    container["ports"] = [{"name": PORT_NAME, "containerPort": render.PORT}]
    container["env"] = [
        {"name": INDEX_ENV, "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.labels['{JOB_INDEX_LABEL}']"}}},
        {"name": contracts.TF_CONFIG, "value": tf_config(spec, name, group.task_type)},
        *container["env"]]
    policy = group.restart_policy
    pod["restartPolicy"] = "OnFailure" if policy in ("OnFailure", "Always") else "Never"
    job: dict[str, Any] = {"completionMode": "Indexed", "completions": 1, "parallelism": 1,
                           "backoffLimit": group.max_restarts if policy != "Never" else 0}
    if policy == "ExitCode":
        job["podFailurePolicy"] = {"rules": [{"action": "FailJob", "onExitCodes": {
            "containerName": render.CONTAINER, "operator": "In",
            "values": PERMANENT_EXIT_CODES}}]}
    if spec.max_running_time is not None:
        job["activeDeadlineSeconds"] = math.ceil(spec.max_running_time)
    job["template"] = template
    return {"name": rjob_name(spec, group.task_type), "replicas": group.count,
            "template": {"metadata": {"labels": dict(labels)}, "spec": job}}


def state_of(job: dict) -> tuple[str, str | None]:
    """A JobSet's state as the job record's, with the failure's message: Completed and
    Failed end it; suspended (waiting for Kueue) is QUEUED; then RUNNING once a replica's
    pod is ready, PREPARING while they start."""
    status = job.get("status") or {}
    true = {c.get("type"): c for c in status.get("conditions") or []
            if c.get("status") == "True"}
    if "Failed" in true:
        return records.FAILED, true["Failed"].get("message") or true["Failed"].get("reason")
    if "Completed" in true:
        return records.SUCCEEDED, None
    if "Suspended" in true or (job.get("spec") or {}).get("suspend"):
        return records.QUEUED, None
    counts = status.get("replicatedJobsStatus") or []
    if any(r.get("ready") for r in counts):
        return records.RUNNING, None
    if any(r.get("active") for r in counts):
        return records.PREPARING, None
    return records.QUEUED, None


def pod_label(labels: dict) -> str | None:
    """A JobSet pod's Cloud ML label (`worker-replica-1`), None for another's pod."""
    kind, index = labels.get(RJOB_LABEL), labels.get(JOB_INDEX_LABEL, "0")
    if kind is None:
        return None
    if kind in contracts.LABEL_KINDS:
        return contracts.replica_label(kind, index)
    return f"{kind}-replica-{index}"
