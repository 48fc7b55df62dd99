"""A batch prediction job's object on the engines: Vertex AI's BatchPredictionJob, or a
Kubernetes Indexed Job whose completions are the shards. Not a runner: the runners'
`render_prediction` (`submit.runners.vertex`, `submit.runners.kubeflow`) call these
renderings and create, follow and cancel what they render.

Vertex (`--runner vertex`): a `CreateBatchPredictionJobRequest` built from
`aiplatform_v1`'s own types. `--model M [--version V]` is the Model resource
(`projects/P/locations/R/models/M`, `@V` for a version); `--model-dir gs://...` is an
`unmanagedContainerModel` whose `artifactUri` is the export, served by Vertex's prebuilt
TensorFlow prediction container (or `--image`). Inputs are `jsonl` (text), `tf-record`
or `tf-record-gzip`; predictions are `jsonl` under `--output-path`;
`--max-worker-count` is `dedicatedResources.maxReplicaCount`, `--batch-size`
`manualBatchTuningParameters.batchSize`. Vertex has no signature choice for TensorFlow
models: `--signature-name` other than serving_default is refused.

Kubernetes (`--runner kubeflow`): a ConfigMap holding the job's shard plan (as the local
runner plans it) and a `batch/v1` Job with `completionMode: Indexed`, `completions` the
shard count and `parallelism` `--max-worker-count`; each pod runs
`python -m predict.batch_worker --job-file /etc/mljob/prediction.json` and predicts the
shard `$JOB_COMPLETION_INDEX` names (skipped when already published). A shard's pod is
retried twice (`backoffLimitPerIndex`), and one shard failing for good fails the Job
(`maxFailedIndexes: 0`). Both are checked against the kubernetes client's models.
"""
from __future__ import annotations

import json
import re

import yaml

from submit.jobdef import spec as specs
from submit.errors import UsageError
from submit.prediction.spec import PredictionSpec

VERTEX_FORMATS = {"text": "jsonl", "tf-record": "tf-record", "tf-record-gzip": "tf-record-gzip"}
# Vertex's prebuilt TensorFlow prediction images (CPU), per registry.
# the newest TensorFlow prediction image aiplatform's SDK lists
# (google.cloud.aiplatform.constants.prediction): older than the TensorFlow that trains
PREDICTION_IMAGE = "{registry}-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest"
PREDICTION_IMAGE_TF = "2.15"
VERTEX_MACHINE = "n1-standard-4"
K8S_IMAGE_HINT = "an image with mljob installed (see `python -m submit JOB --runner " \
                 "kubeflow --dry-run`'s Dockerfile)"
PLAN_MOUNT = "/etc/mljob"
MAX_CONFIGMAP_BYTES = 1000 * 1024  # Kubernetes refuses ConfigMaps over 1 MiB
SHARD_RETRIES = 2                  # each shard tried three times, as on the local runner


def vertex_request(spec: PredictionSpec, project: str, image: str | None = None):
    """The CreateBatchPredictionJobRequest, built from aiplatform_v1's types."""
    from google.cloud import aiplatform_v1 as v1
    _require_gs(spec)
    if spec.signature_name not in (None, "serving_default"):
        raise UsageError(f"--signature-name {spec.signature_name!r:.60}: Vertex AI serves "
                         "a TensorFlow model's serving_default signature only; export the "
                         "signature you want as serving_default, or use the local runner")
    parent = f"projects/{project}/locations/{spec.region}"
    job = v1.BatchPredictionJob(
        display_name=spec.job_id,
        input_config=v1.BatchPredictionJob.InputConfig(
            instances_format=VERTEX_FORMATS[spec.data_format],
            gcs_source=v1.GcsSource(uris=list(spec.input_paths))),
        output_config=v1.BatchPredictionJob.OutputConfig(
            predictions_format="jsonl",
            gcs_destination=v1.GcsDestination(output_uri_prefix=spec.output_path)),
        dedicated_resources=v1.BatchDedicatedResources(
            machine_spec=v1.MachineSpec(machine_type=VERTEX_MACHINE),
            starting_replica_count=1, max_replica_count=spec.max_worker_count),
        manual_batch_tuning_parameters=v1.ManualBatchTuningParameters(
            batch_size=spec.batch_size),
        labels={**spec.labels, "mljob-job-id": spec.job_id.lower()})
    if spec.model:
        name = spec.model if "/" in spec.model else f"{parent}/models/{spec.model}"
        job.model = f"{name}@{spec.version}" if spec.version else name
    else:
        registry = next((r for p, r in (("europe", "europe"), ("asia", "asia"),
                                        ("australia", "asia")) if spec.region.startswith(p)),
                        "us")
        job.unmanaged_container_model = v1.UnmanagedContainerModel(
            artifact_uri=spec.model_dir,
            container_spec=v1.ModelContainerSpec(
                image_uri=image or PREDICTION_IMAGE.format(registry=registry)))
    return v1.CreateBatchPredictionJobRequest(parent=parent, batch_prediction_job=job)


def prebuilt_note() -> str:
    """What serving with Vertex's prebuilt image means for an export made here."""
    made = next((v for v in (_version(n) for n in ("tensorflow", "tensorflow-cpu")) if v),
                "this machine's")
    return (f"note: Vertex's prebuilt image serves with TensorFlow {PREDICTION_IMAGE_TF}; "
            f"an export made with TensorFlow {made} loads there only if it uses no op "
            f"newer than {PREDICTION_IMAGE_TF}. To serve it with the TensorFlow that made "
            "it, pass --image with an image running mljob's tensorflow_model_server "
            "(docs/predict.md, Vertex AI)")


def _version(name: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _require_gs(spec: PredictionSpec) -> None:
    given = [("--input-paths", p) for p in spec.input_paths] + [
        ("--output-path", spec.output_path)] + (
        [("--model-dir", spec.model_dir)] if spec.model_dir else [])
    for flag, url in given:
        if not url.startswith("gs://"):
            raise UsageError(f"{flag} {url} cannot be read by the engine's workers; use a "
                             "gs://BUCKET/PATH URL with --runner vertex or kubeflow")


def k8s_name(job_id: str) -> str:
    name = job_id.lower().replace("_", "-")[:52].rstrip("-")
    return name


def k8s_objects(spec: PredictionSpec, plan: dict, image: str, namespace: str) -> list[dict]:
    """The ConfigMap of the shard plan and the Indexed Job, as plain dicts."""
    name = k8s_name(spec.job_id)
    labels = {**spec.labels, "app.kubernetes.io/managed-by": "mljob",
              "mljob/job-id": spec.job_id.lower()}
    text = json.dumps(plan, sort_keys=True)
    if len(text) > MAX_CONFIGMAP_BYTES:
        raise UsageError(f"the job's {len(plan['shards'])} shards make a plan of "
                         f"{len(text)} bytes, more than a Kubernetes ConfigMap holds; "
                         "give fewer, larger input files")
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": f"{name}-plan", "namespace": namespace,
                               "labels": labels},
                  "data": {"prediction.json": text}}
    count = len(plan["shards"])
    container = {
        "name": "predict", "image": image,
        "command": ["python", "-m", "predict.batch_worker", "--job-file",
                    f"{PLAN_MOUNT}/prediction.json", "--threads", "1"],
        "env": [{"name": "CLOUD_ML_JOB_ID", "value": spec.job_id}],
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"},
                      "limits": {"memory": "2Gi"}},
        "volumeMounts": [{"name": "plan", "mountPath": PLAN_MOUNT, "readOnly": True}]}
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": name, "namespace": namespace, "labels": labels},
           "spec": {"completionMode": "Indexed", "completions": count,
                    "parallelism": min(spec.max_worker_count, count),
                    "backoffLimitPerIndex": SHARD_RETRIES, "maxFailedIndexes": 0,
                    "template": {"metadata": {"labels": labels}, "spec": {
                        "restartPolicy": "Never", "containers": [container],
                        "volumes": [{"name": "plan", "configMap": {
                            "name": f"{name}-plan"}}]}}}}
    return [config_map, job]


def vertex_output(job) -> dict:
    """A BatchPredictionJob's outcome (aiplatform_v1's) as Cloud ML's predictionOutput."""
    stats = job.completion_stats
    return {"outputPath": job.output_info.gcs_output_directory
            or job.output_config.gcs_destination.output_uri_prefix,
            "predictionCount": str(stats.successful_count),
            "errorCount": str(stats.failed_count),
            "nodeHours": job.resources_consumed.replica_hours}


def k8s_job(spec: PredictionSpec, image: str | None,
            namespace: str | None) -> tuple[list[dict], str]:
    """The ConfigMap and Indexed Job of a job on Kubernetes, everything checked, and
    the YAML `--dry-run` prints."""
    _require_gs(spec)
    if not image:
        raise UsageError(f"--runner kubeflow needs --image: {K8S_IMAGE_HINT}")
    specs.check_text(image, "--image")
    if namespace is not None and not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?",
                                                  namespace):
        raise UsageError(f"--namespace {namespace!r:.60} is not a Kubernetes namespace "
                         "name; use lower-case letters, digits and '-'")
    from submit.prediction.plan import build_plan
    if spec.model:
        raise UsageError("--runner kubeflow takes --model-dir gs://...: a cluster has no "
                         "model registry")
    plan = json.loads(build_plan(spec, resume=True).to_json())
    plan["run_dir"] = plan["log_dir"] = ""
    objects = k8s_objects(spec, plan, image, namespace or "default")
    return objects, yaml.safe_dump_all(objects, sort_keys=False).rstrip()


__all__ = ["vertex_request", "vertex_output", "k8s_objects", "k8s_job"]
