"""The Vertex AI engine: the job as a CustomJob of up to four worker pools (a tuning job
a HyperparameterTuningJob, a batch prediction job a BatchPredictionJob rendered by
`submit.prediction.render`).

Vertex AI runs a Python package the way Cloud ML Engine did: each replica pip-installs
the staged sdists (`package_uris`: the package, its `--packages`, and mljob's core unless
the package ships mljob) into an executor image and runs `python -m MODULE ARGS` through
mljob's launcher (`python_module` mljob.fitting.launch, the module its first argument:
`mljob.fitting`), with TF_CONFIG set by Vertex. The pools come in Vertex's fixed order:
0 the chief (one replica), 1 workers, 2 parameter servers, 3 evaluators; a skipped
middle pool is an empty WorkerPoolSpec (the API's rule: "all worker pools except the
first one are optional and can be skipped by providing an empty value") and trailing
empty pools are left out.

Every client call goes over REST: `JobServiceClient(transport="rest")` at
`{region}-aiplatform.googleapis.com` for jobs, Cloud Logging's `entries:list` for logs
(`submit.runners.vertex_logs`), both with Application Default Credentials. As
STORAGE_EMULATOR_HOST does for gs://, MLJOB_VERTEX_API_ENDPOINT and
MLJOB_LOGGING_API_ENDPOINT (e.g. http://127.0.0.1:PORT) send those calls elsewhere with
anonymous credentials; the tests point them at a recording HTTP endpoint, so the code
path is the production one.
"""
from __future__ import annotations

import datetime
import json
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform_v1
from google.protobuf import json_format

from mljob import contracts, machines
from mljob.fitting import LAUNCHER
from submit.jobdef import containers, spec as specs, tuning_spec
from submit import jobs
from submit import training_output as training_outputs
from submit.errors import UsageError
from submit.packaging.package import Package
from submit.runners import vertex_logs
from submit.prediction import render as prediction_render
from submit.prediction.spec import PredictionSpec
from submit.runners.engine import ClusterEngine, EngineOptions, EngineStatus, Rendered
from submit.runners.google_api import CALL_TIMEOUT_S, api_errors, one_line
from submit.runners.vertex_logs import (  # noqa: F401 - the engine's names, as before
    LOGGING_ENDPOINT_ENV, replica_label, vertex_task_name)
from submit.jobdef.spec import JobSpec

VERTEX_ENDPOINT_ENV = "MLJOB_VERTEX_API_ENDPOINT"
PROJECT_ENVS = ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT")
DEFAULT_REGION = "us-central1"
# The job id as submitted. Not CLOUD_ML_JOB_ID: Vertex sets that one itself, to the
# CustomJob's numeric id, and its own tools (the TensorBoard profiler) read it.
JOB_ID_ENV = contracts.MLJOB_JOB_ID_ENV
BATCH_KIND = "batchPredictionJob"        # the handle's kind of a batch prediction job
TUNING_KIND = "hyperparameterTuningJob"  # the handle's kind when it is one, else CustomJob
# The newest TensorFlow prebuilt training images Vertex lists (TF 2.17, Python 3.10).
IMAGE = "{registry}-docker.pkg.dev/vertex-ai/training/tf-{kind}.2-17.py310:latest"
REGISTRIES = {"europe": "europe", "asia": "asia", "australia": "asia"}  # else "us"

_REGION = re.compile(r"[a-z]+(-[a-z]+)+[0-9]{1,2}")
_PROJECT = re.compile(r"([a-z][a-z0-9.\-]*[a-z0-9]:)?[a-z][a-z0-9\-]{4,28}[a-z0-9]|[0-9]+")
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")

# Machine names map through mljob/machines.py (the retired K80s are T4s there).
T4, RETIRED_ACCELERATORS = machines.T4, machines.RETIRED_ACCELERATORS
OWN_LABELS = ("mljob-job-id", "mljob-scale-tier", "mljob-package-sha256")
POOLS = contracts.VERTEX_POOL_TYPES  # Vertex's pool index per replica type
STATES = {  # Vertex JobState -> (record state, message)
    "JOB_STATE_UNSPECIFIED": (jobs.QUEUED, None), "JOB_STATE_QUEUED": (jobs.QUEUED, None),
    "JOB_STATE_PENDING": (jobs.PREPARING, None), "JOB_STATE_RUNNING": (jobs.RUNNING, None),
    "JOB_STATE_UPDATING": (jobs.RUNNING, None),
    "JOB_STATE_PAUSED": (jobs.QUEUED, "Vertex AI paused the job"),
    "JOB_STATE_SUCCEEDED": (jobs.SUCCEEDED, None), "JOB_STATE_FAILED": (jobs.FAILED, None),
    "JOB_STATE_EXPIRED": (jobs.FAILED, "Vertex AI let the job expire"),
    "JOB_STATE_PARTIALLY_SUCCEEDED": (jobs.FAILED, "Vertex AI reports partial success"),
    "JOB_STATE_CANCELLING": (jobs.CANCELLING, None),
    "JOB_STATE_CANCELLED": (jobs.CANCELLED, None),
}


class VertexEngine(ClusterEngine):
    """`--runner vertex`: see the module docstring and docs/engine-vertex.md."""

    name = "vertex"
    poll_s = 5.0   # between Cloud Logging reads while following (its quota: 60 a minute)

    def __init__(self, options: EngineOptions):
        super().__init__(options)

    # -- check and render: no network ------------------------------------------------

    def check(self, spec: JobSpec) -> None:
        if not spec.job_dir:
            raise UsageError("--runner vertex needs --job-dir gs://BUCKET/PATH: it becomes "
                             "the job's base output directory, which every replica writes")
        if not spec.job_dir.startswith("gs://"):
            raise UsageError(f"--job-dir {spec.job_dir} cannot be reached by Vertex AI "
                             "replicas; use a gs://BUCKET/PATH job dir with --runner vertex")
        if spec.staging_bucket and not spec.staging_bucket.startswith("gs://"):
            raise UsageError(f"--staging-bucket {spec.staging_bucket} cannot be read by "
                             "Vertex AI; use a gs://BUCKET, or drop it to stage under "
                             "--job-dir")
        if spec.package_uri and not spec.package_uri.startswith("gs://"):
            raise UsageError(f"trainingInput.packageUris {spec.package_uri} cannot be read "
                             "by Vertex AI; stage the package to gs:// or use --package-path")
        self._location(spec)
        image, account = self.options.image, _service_account(self.options, spec)
        if image is not None and (not image or re.search(r"\s", image)):
            raise UsageError(f"--image {image!r} is not an image URI; pass one of Vertex's "
                             "prebuilt training images, e.g. " + _image(DEFAULT_REGION, False))
        if account is not None and not _EMAIL.fullmatch(account):
            where = "--service-account" if self.options.service_account else \
                "trainingInput.serviceAccount"
            raise UsageError(f"{where} {account!r} is not a service account "
                             "email; write it like NAME@PROJECT.iam.gserviceaccount.com")
        _check_engine_keys(spec, account, self._location(spec)[1])
        if spec.custom_containers and image is not None:
            raise UsageError("--image names the executor image a package is installed in; "
                             "custom containers name theirs with --master-image-uri "
                             "(imageUri): drop --image")
        for group in spec.groups:
            _machine_spec(spec, group)
        room = specs.MAX_LABELS - len(OWN_LABELS)
        if len(spec.labels) > room:
            raise UsageError(f"{len(spec.labels)} labels are too many for Vertex AI, which "
                             f"takes {specs.MAX_LABELS} and mljob sets {len(OWN_LABELS)}; "
                             f"give at most {room}")
        tuning = spec.tuning
        if tuning is not None and tuning.resume_from:
            raise UsageError("trainingInput.hyperparameters.resumePreviousJobId: a Vertex "
                             "AI HyperparameterTuningJob cannot continue an earlier study; "
                             "drop it (or tune with the local runner)")

    def render(self, spec: JobSpec, package: Package | None) -> Rendered:
        project, region = self._location(spec)
        parent = f"projects/{project}/locations/{region}"
        groups = [spec.group(t) for t in POOLS]
        pools = [_pool(spec, g, package, self.options.image, region)
                 if g else aiplatform_v1.WorkerPoolSpec() for g in groups]
        while not spec.group(POOLS[len(pools) - 1]):
            pools.pop()   # trailing empty pools are left out; pool 0 always exists
        job_spec = aiplatform_v1.CustomJobSpec(
            worker_pool_specs=pools,
            base_output_directory=aiplatform_v1.GcsDestination(
                output_uri_prefix=spec.job_dir))
        _engine_keys(job_spec, spec, _service_account(self.options, spec))
        scheduling = aiplatform_v1.Scheduling()
        strategy = spec.engine.strategy
        if strategy is not None:
            # proto-plus ships no type information: mypy cannot see its enums' EnumMeta
            scheduling.strategy = aiplatform_v1.Scheduling.Strategy[strategy]  # type: ignore[misc]
        if any(g.restart_policy != "Never" for g in spec.groups):
            # Vertex restarts a lost replica itself and has no per-exit-code policy; what
            # it can do is restart the whole job when a replica restarts, so every replica
            # resumes together from the latest checkpoint, as the trainer expects.
            scheduling.restart_job_on_worker_restart = True
        if spec.max_running_time is not None:
            scheduling.timeout = _duration(spec.max_running_time)
        if spec.max_wait_time is not None:
            scheduling.max_wait_duration = _duration(spec.max_wait_time)
        if scheduling != aiplatform_v1.Scheduling():
            job_spec.scheduling = scheduling
        handle = {"project": project, "region": region, "parent": parent,
                  "display_name": spec.job_id}
        tuning = spec.tuning
        if tuning is not None:  # each trial is today's CustomJob, its parameters as flags
            request = aiplatform_v1.CreateHyperparameterTuningJobRequest(
                parent=parent, hyperparameter_tuning_job=aiplatform_v1.HyperparameterTuningJob(
                    display_name=spec.job_id, study_spec=study_spec(tuning),
                    max_trial_count=tuning.max_trials,
                    parallel_trial_count=tuning.max_parallel_trials,
                    max_failed_trial_count=tuning.max_failed_trials or 0,
                    trial_job_spec=job_spec, labels=_labels(spec, package)))
            handle["kind"] = TUNING_KIND
        else:
            request = aiplatform_v1.CreateCustomJobRequest(
                parent=parent, custom_job=aiplatform_v1.CustomJob(
                    display_name=spec.job_id, job_spec=job_spec,
                    labels=_labels(spec, package)))
        text = _to_json(request)
        return Rendered(body=json.loads(text), text=text, handle=handle)

    def render_prediction(self, spec: PredictionSpec) -> Rendered:
        """A CreateBatchPredictionJobRequest (`submit.prediction.render`), in the
        spec's region."""
        project, image = self._location(None)[0], self.options.image
        request = prediction_render.vertex_request(spec, project, image)
        text = _to_json(request)
        handle = {"project": project, "region": spec.region, "parent": request.parent,
                  "display_name": spec.job_id, "kind": BATCH_KIND}
        notes = (prediction_render.prebuilt_note(),) if spec.model_dir and not image else ()
        return Rendered(body=json.loads(text), text=text, handle=handle, notes=notes,
                        record=spec.record(), named=" ({name})")

    def _location(self, spec: JobSpec | None) -> tuple[str, str]:
        project = self.options.project or next(
            (os.environ[k] for k in PROJECT_ENVS if os.environ.get(k)), None)
        if not project:
            raise UsageError("--runner vertex needs a Google Cloud project; pass --project "
                             "PROJECT_ID (or set GOOGLE_CLOUD_PROJECT)")
        if not _PROJECT.fullmatch(project):
            raise UsageError(f"--project {project!r} is not a Google Cloud project id; "
                             "pass one like my-project-123 (see `gcloud projects list`)")
        region = self.options.region or (spec and spec.region) or DEFAULT_REGION
        if not _REGION.fullmatch(region):
            raise UsageError(f"--region {region!r} is not a Google Cloud region; pass one "
                             f"like {DEFAULT_REGION} or europe-west4")
        return project, region

    # -- the API ------------------------------------------------------------------------

    def create(self, rendered: Rendered) -> Mapping[str, Any]:
        handle = dict(rendered.handle)
        with api_errors(f"create job {handle['display_name']}", handle):
            client = _job_client(handle["region"])
            if handle.get("kind") == BATCH_KIND:
                job = client.create_batch_prediction_job(
                    request=aiplatform_v1.CreateBatchPredictionJobRequest.from_json(
                        rendered.text), timeout=CALL_TIMEOUT_S)
            elif handle.get("kind") == TUNING_KIND:
                job = client.create_hyperparameter_tuning_job(
                    request=aiplatform_v1.CreateHyperparameterTuningJobRequest.from_json(
                        rendered.text), timeout=CALL_TIMEOUT_S)
            else:
                job = client.create_custom_job(
                    request=aiplatform_v1.CreateCustomJobRequest.from_json(rendered.text),
                    timeout=CALL_TIMEOUT_S)
        handle["name"] = job.name
        handle["id"] = job.name.rsplit("/", 1)[-1]
        return handle

    def status(self, handle: Mapping[str, Any]) -> EngineStatus:
        predicted = None
        with api_errors(f"describe job {handle.get('display_name')}", handle):
            client = _job_client(handle["region"])
            if handle.get("kind") == BATCH_KIND:
                job = client.get_batch_prediction_job(name=handle["name"],
                                                      timeout=CALL_TIMEOUT_S)
                predicted = prediction_render.vertex_output(job)
            else:
                get = (client.get_hyperparameter_tuning_job
                       if handle.get("kind") == TUNING_KIND else client.get_custom_job)
                job = get(name=handle["name"], timeout=CALL_TIMEOUT_S)
        state_name = getattr(job.state, "name", str(job.state))  # an int if unknown
        state, message = STATES.get(state_name, (jobs.RUNNING, None))
        if state == jobs.FAILED and job.error.message:
            message = one_line(job.error.message)
        output = None
        if handle.get("kind") == TUNING_KIND:
            output = training_output(job)
        return EngineStatus(state=state, message=message, training_output=output,
                            prediction_output=predicted)

    def update_labels(self, record, old, new) -> str | None:
        """Vertex AI's JobService has no update for a CustomJob or a
        HyperparameterTuningJob (create, get, list, cancel, delete): the job keeps the
        labels it was created with, and mljob's record gets the new ones."""
        return ("Vertex AI cannot change a created job's labels (its JobService has no "
                "update); the labels are changed in the job's record only")

    def cancel(self, handle: Mapping[str, Any]) -> str:
        with api_errors(f"cancel job {handle.get('display_name')}", handle):
            client = _job_client(handle["region"])
            cancel = (client.cancel_hyperparameter_tuning_job
                      if handle.get("kind") == TUNING_KIND else
                      client.cancel_batch_prediction_job
                      if handle.get("kind") == BATCH_KIND
                      else client.cancel_custom_job)
            cancel(name=handle["name"], timeout=CALL_TIMEOUT_S)
        return jobs.CANCELLING

    def logs(self, handle: Mapping[str, Any], *, task_name: str | None = None,
             follow: bool = True) -> Iterator[str]:
        """Replica logs from Cloud Logging (`submit.runners.vertex_logs`)."""
        return vertex_logs.read(
            handle, task_name=task_name, follow=follow, poll_s=self.poll_s,
            ended_now=lambda: self.status(handle).state in jobs.FINAL_STATES)


def _pool(spec: JobSpec, group: specs.ReplicaGroup, package: Package | None,
          image: str | None, region: str) -> aiplatform_v1.WorkerPoolSpec:
    machine = _machine_spec(spec, group)
    if group.image_uri:  # a custom container: Vertex's containerSpec, the image as given
        container = aiplatform_v1.ContainerSpec(
            image_uri=group.image_uri, command=list(group.container_command),
            args=containers.args_for(group, spec.trainer_args),
            env=[aiplatform_v1.EnvVar(name=JOB_ID_ENV, value=spec.job_id)])
        return aiplatform_v1.WorkerPoolSpec(replica_count=group.count,
                                            machine_spec=machine, container_spec=container)
    assert package is not None  # a replica without a container installs the package
    return aiplatform_v1.WorkerPoolSpec(
        replica_count=group.count, machine_spec=machine,
        python_package_spec=aiplatform_v1.PythonPackageSpec(
            executor_image_uri=image or _image(region, bool(machine.accelerator_count)),
            package_uris=[p.url for p in package.all],  # the package, --packages, mljob
            python_module=LAUNCHER,  # which runs spec.module_name as -m would
            args=[spec.module_name, *spec.trainer_args],
            env=[aiplatform_v1.EnvVar(name=JOB_ID_ENV, value=spec.job_id)]))


def _service_account(options: EngineOptions, spec: JobSpec) -> str | None:
    """--service-account, else config.yaml's trainingInput.serviceAccount."""
    return options.service_account or spec.engine.service_account


def _check_engine_keys(spec: JobSpec, account: str | None, region: str) -> None:
    """What Vertex AI refuses of `submit.jobdef.engine_keys`, refused here in one line."""
    keys = spec.engine
    kubernetes_only = keys.given("queue_name", "ttl_seconds")
    if kubernetes_only:
        raise UsageError(f"trainingInput.{kubernetes_only[0]} is for --runner "
                         "kubeflow (Kubernetes); drop it for --runner vertex")
    board = keys.tensorboard
    if board is not None and account is None:
        raise UsageError("trainingInput.tensorboard needs the service account the job "
                         "runs as (Vertex AI's rule); give --service-account or "
                         "trainingInput.serviceAccount")
    if board is not None and board.split("/")[3] != region:
        raise UsageError(f"trainingInput.tensorboard {board} is in {board.split('/')[3]}, "
                         f"the job in {region}; use a TensorBoard of the job's region")


def _engine_keys(job_spec: aiplatform_v1.CustomJobSpec, spec: JobSpec,
                 account: str | None) -> None:
    """trainingInput's Vertex AI keys (`submit.jobdef.engine_keys`) onto the CustomJobSpec."""
    keys = spec.engine
    if account:
        job_spec.service_account = account
    if keys.base_output_directory:
        job_spec.base_output_directory = aiplatform_v1.GcsDestination(
            output_uri_prefix=keys.base_output_directory)
    if keys.network:
        job_spec.network = keys.network
    if keys.tensorboard:
        job_spec.tensorboard = keys.tensorboard
    if keys.enable_web_access:
        job_spec.enable_web_access = True


TRIAL_STATES = {"SUCCEEDED": jobs.SUCCEEDED, "INFEASIBLE": jobs.FAILED,
                "ACTIVE": jobs.RUNNING, "REQUESTED": jobs.QUEUED,
                "STOPPING": jobs.CANCELLING}


def training_output(job: aiplatform_v1.HyperparameterTuningJob) -> dict:
    """Vertex AI's trials as Cloud ML's trainingOutput, best first."""
    metric = job.study_spec.metrics[0] if job.study_spec.metrics else None
    tag = metric.metric_id if metric else ""
    trials = []
    for t in job.trials:
        out = {"trialId": t.id, "state": TRIAL_STATES.get(t.state.name, jobs.RUNNING),
               "hyperparameters": {p.parameter_id: _value_text(p.value)
                                   for p in t.parameters},
               "allMetrics": [m for m in (_metric(x, tag)
                                          for x in t.measurements) if m],
               "isTrialStoppedEarly": False}
        final = _metric(t.final_measurement, tag) if "final_measurement" in t \
            else None
        if final:
            out["finalMetric"] = final
        for key, stamp in (("startTime", t.start_time), ("endTime", t.end_time)):
            if stamp:
                out[key] = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
        if t.infeasible_reason:
            out["errorMessage"] = one_line(t.infeasible_reason)
        trials.append(out)
    return training_outputs.output_of(
        trials, metric_tag=tag,
        maximize=not (metric and metric.goal.name == "MINIMIZE"))


def _metric(measurement, tag: str) -> dict | None:
    for m in measurement.metrics:
        if m.metric_id == tag:
            return {"trainingStep": str(measurement.step_count), "objectiveValue": m.value}
    return None


def _value_text(value) -> str:
    """A trial parameter's protobuf Value as Cloud ML's string."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def study_spec(tuning: tuning_spec.TuningSpec) -> aiplatform_v1.StudySpec:
    """Cloud ML's HyperparameterSpec as Vertex AI's StudySpec: the same metric, goal,
    parameters, scale types and algorithm; early stopping is Vertex's median rule (the
    local runner's too)."""
    study = aiplatform_v1.StudySpec
    params = []
    for p in tuning.params:
        param = study.ParameterSpec(parameter_id=p.name)
        if p.type == "DOUBLE":
            low, high = p.bounds
            param.double_value_spec = study.ParameterSpec.DoubleValueSpec(
                min_value=float(low), max_value=float(high))
        elif p.type == "INTEGER":
            low, high = p.bounds
            param.integer_value_spec = study.ParameterSpec.IntegerValueSpec(
                min_value=int(low), max_value=int(high))
        elif p.type == "CATEGORICAL":
            param.categorical_value_spec = study.ParameterSpec.CategoricalValueSpec(
                values=list(p.values))
        else:
            param.discrete_value_spec = study.ParameterSpec.DiscreteValueSpec(
                values=[float(v) for v in p.values])
        if p.type in ("DOUBLE", "INTEGER"):
            param.scale_type = study.ParameterSpec.ScaleType[p.scale]  # type: ignore[misc]
        params.append(param)
    # proto-plus ships no type information: mypy cannot see that its enums index by name
    goal = study.MetricSpec.GoalType[tuning.goal]  # type: ignore[misc]
    algorithm = study.Algorithm[tuning.algorithm]  # type: ignore[misc]
    out = study(metrics=[study.MetricSpec(metric_id=tuning.metric_tag, goal=goal)],
                parameters=params, algorithm=algorithm)
    if tuning.early_stopping:
        out.median_automated_stopping_spec = study.MedianAutomatedStoppingSpec(
            use_elapsed_duration=False)
    return out


def _machine_spec(spec: JobSpec, group: specs.ReplicaGroup) -> aiplatform_v1.MachineSpec:
    """The group's machine: its legacy name's equivalent (n1-* names pass through), with
    `<type>Config.acceleratorConfig` overriding the accelerator's type and count."""
    key = specs.CONFIG_KEYS[group.task_type]
    entry = machines.lookup(group.machine_type)
    machine_type, accel_type, count = entry.gce_type, entry.accelerator, entry.gpus
    accel_type = group.accelerator_type or accel_type
    count = group.accelerator_count or count or (1 if accel_type else 0)
    machine = aiplatform_v1.MachineSpec(machine_type=machine_type)
    if count:
        accel_type = accel_type or T4
        if accel_type in RETIRED_ACCELERATORS:
            raise UsageError(f"trainingInput.{key}.acceleratorConfig.type {accel_type} is "
                             "retired on Vertex AI; use "
                             f"{RETIRED_ACCELERATORS[accel_type]} or another current GPU")
        try:
            # proto-plus ships no type information: mypy cannot see its enums' EnumMeta
            machine.accelerator_type = aiplatform_v1.AcceleratorType[accel_type]  # type: ignore[misc]
        except KeyError:
            known = [a.name for a in aiplatform_v1.AcceleratorType  # type: ignore[attr-defined]
                     if a.name.startswith("NVIDIA") and a.name not in RETIRED_ACCELERATORS]
            raise UsageError(f"trainingInput.{key}.acceleratorConfig.type {accel_type!r} is "
                             f"not a Vertex AI accelerator; use one of {', '.join(known)}") \
                from None
        machine.accelerator_count = count
    return machine


def _image(region: str, gpu: bool) -> str:
    registry = REGISTRIES.get(region.split("-", 1)[0], "us")
    return IMAGE.format(registry=registry, kind="gpu" if gpu else "cpu")


def _labels(spec: JobSpec, package: Package | None) -> dict[str, str]:
    """The job's labels (checked by Google Cloud's rules in `submit.jobdef.spec`) and mljob's own
    (`mljob-*`, a prefix the job's may not use). Vertex label values are at most 63
    lower-case letters, digits, `_` and `-`: job ids are letters, digits and `_`, so
    lower-casing is enough (display_name keeps the case)."""
    own = (spec.job_id.lower()[:63], spec.scale_tier.lower(),
           package.sha256[:16] if package else "custom-container")
    return {**spec.labels, **dict(zip(OWN_LABELS, own, strict=True))}


def _duration(seconds: float) -> datetime.timedelta:
    """A scheduling Duration (proto-plus takes a timedelta)."""
    return datetime.timedelta(seconds=seconds)


def _to_json(request) -> str:
    """The request as the REST API takes it: camelCase, enums by name, only fields that
    are set, keys sorted so that --dry-run prints the same text for the same job."""
    return json_format.MessageToJson(type(request).pb(request), sort_keys=True, indent=2)


# -- the client ------------------------------------------------------------------------

def _job_client(region: str) -> aiplatform_v1.JobServiceClient:
    endpoint = os.environ.get(VERTEX_ENDPOINT_ENV)
    credentials = AnonymousCredentials() if endpoint else None  # None: ADC
    return aiplatform_v1.JobServiceClient(
        credentials=credentials, transport="rest",
        client_options={"api_endpoint": endpoint or f"{region}-aiplatform.googleapis.com"})


