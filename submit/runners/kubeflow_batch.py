"""`--runner kubeflow`'s batch prediction job: a ConfigMap holding the shard plan and a
`batch/v1` Indexed Job whose completions are the shards, as `submit.prediction.render`
renders them (everything checked there). This module is what the engine
(`submit.runners.kubeflow`) does with them through the kubernetes client: create the
ConfigMap, then the Job; read the Job's state (Complete, Failed; RUNNING while a pod
is active); label each pod by its completion index (`worker-replica-N`, the local
runner's labels for its workers); delete the Job with its pods, then the ConfigMap.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kubernetes

from mljob import contracts
from submit import jobs as records
from submit.prediction import render as prediction_render
from submit.prediction.spec import PredictionSpec
from submit.runners.engine import EngineOptions, Rendered

KIND = "Job"                       # the handle's kind: a batch/v1 Job
CONTAINER = "predict"              # its pods' one container
NAME_LABEL = "job-name"            # Kubernetes' label on a Job's pods
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
TIMEOUT_S = 30


def render(spec: PredictionSpec, options: EngineOptions) -> Rendered:
    """The ConfigMap and the Job, as `--dry-run` prints them (YAML)."""
    (config_map, job), text = prediction_render.k8s_job(spec, options.image,
                                                        options.namespace)
    meta = job["metadata"]
    handle = {"name": meta["name"], "namespace": meta["namespace"], "kind": KIND,
              "context": options.context}
    return Rendered(body={"configMap": config_map, "job": job}, text=text, handle=handle,
                    record=spec.record(), named=" (namespace {namespace})")


def create(client, rendered: Rendered, errors) -> str | None:
    """Create the plan's ConfigMap, then the Job; the Job's uid. `errors(handle,
    doing)`: the engine's one-line errors."""
    handle, body = rendered.handle, rendered.body
    namespace = handle["namespace"]
    with errors(handle, "create the Job's plan ConfigMap"):
        kubernetes.client.CoreV1Api(client).create_namespaced_config_map(
            namespace, dict(body["configMap"]), _request_timeout=TIMEOUT_S)
    with errors(handle, "create the Job"):
        created = kubernetes.client.BatchV1Api(client).create_namespaced_job(
            namespace, dict(body["job"]), _request_timeout=TIMEOUT_S)
    return created.metadata.uid if created.metadata else None


def read(client, handle: Mapping[str, Any], errors) -> dict:
    """The Job as the API returns it, as a dict."""
    with errors(handle, "read the Job"):
        job = kubernetes.client.BatchV1Api(client).read_namespaced_job(
            handle["name"], handle["namespace"], _request_timeout=TIMEOUT_S)
    return client.sanitize_for_serialization(job)


def state_of(job: dict) -> tuple[str, str | None]:
    """A Job's state as the job record's: Complete and Failed end it (with the failure's
    message), an active pod is RUNNING, else QUEUED."""
    status = job.get("status") or {}
    true = {c.get("type"): c for c in status.get("conditions") or []
            if c.get("status") == "True"}
    if "Failed" in true:
        return records.FAILED, true["Failed"].get("message") or true["Failed"].get("reason")
    if "Complete" in true:
        return records.SUCCEEDED, None
    if status.get("active"):
        return records.RUNNING, None
    return records.QUEUED, None


def delete(client, handle: Mapping[str, Any], errors, gone: type[Exception]) -> None:
    """Delete the Job (its pods with it) and its plan; either being gone already is
    fine."""
    name, namespace = handle["name"], handle["namespace"]
    for doing, call, target in (
            ("delete the Job", kubernetes.client.BatchV1Api(client).delete_namespaced_job,
             name),
            ("delete the Job's plan ConfigMap",
             kubernetes.client.CoreV1Api(client).delete_namespaced_config_map,
             f"{name}-plan")):
        try:
            with errors(handle, doing):
                call(target, namespace, propagation_policy="Foreground",
                     _request_timeout=TIMEOUT_S)
        except gone:
            pass


def pod_label(labels: Mapping[str, str]) -> str | None:
    """A Job's pod's label (`worker-replica-3` for completion index 3), None for
    another's pod."""
    index = labels.get(INDEX_LABEL)
    return None if index is None else contracts.replica_label("worker", index)
