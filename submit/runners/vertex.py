"""The Vertex AI engine: the job as a CustomJob of up to four worker pools.

Vertex AI runs a Python package the way Cloud ML Engine did: each replica pip-installs
the staged sdist (`package_uris`) into an executor image and runs `python -m MODULE ARGS`,
with TF_CONFIG set by Vertex. The pools come in Vertex's fixed order: 0 the chief (one
replica), 1 workers, 2 parameter servers, 3 evaluators; a skipped middle pool is an empty
WorkerPoolSpec (the API's rule: "all worker pools except the first one are optional and
can be skipped by providing an empty value") and trailing empty pools are left out.

Every client call goes over REST: `JobServiceClient(transport="rest")` at
`{region}-aiplatform.googleapis.com` for jobs, Cloud Logging's `entries:list` for logs,
both with Application Default Credentials. As STORAGE_EMULATOR_HOST does for gs://,
MLJOB_VERTEX_API_ENDPOINT and MLJOB_LOGGING_API_ENDPOINT (e.g. http://127.0.0.1:PORT)
send those calls elsewhere with anonymous credentials; the tests point them at a
recording HTTP endpoint, so the code path is the production one.
"""
from __future__ import annotations

import calendar
import contextlib
import json
import os
import re
import time
from typing import Any
from collections.abc import Iterator, Mapping

import google.auth
import requests
from google.api_core import exceptions as api_exceptions
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials
from google.auth.transport.requests import AuthorizedSession
from google.cloud import aiplatform_v1
from google.protobuf import json_format

from mljob import contracts, machines
from submit import jobs, logs, spec as specs, tuning_spec
from submit.errors import SubmitError, UsageError
from submit.package import Package
from submit.runners.engine import ClusterEngine, EngineOptions, EngineStatus, Rendered
from submit.spec import JobSpec

VERTEX_ENDPOINT_ENV = "MLJOB_VERTEX_API_ENDPOINT"
LOGGING_ENDPOINT_ENV = "MLJOB_LOGGING_API_ENDPOINT"
LOGGING_API = "https://logging.googleapis.com"
PROJECT_ENVS = ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT")
DEFAULT_REGION = "us-central1"
CALL_TIMEOUT_S = 60.0
LOG_LAG_S = 5.0
# The job id as submitted. Not CLOUD_ML_JOB_ID: Vertex sets that one itself, to the
# CustomJob's numeric id, and its own tools (the TensorBoard profiler) read it.
JOB_ID_ENV = contracts.MLJOB_JOB_ID_ENV
TUNING_KIND = "hyperparameterTuningJob"  # the handle's kind when it is one, else CustomJob
# The newest TensorFlow prebuilt training images Vertex lists (TF 2.17, Python 3.10).
IMAGE = "{registry}-docker.pkg.dev/vertex-ai/training/tf-{kind}.2-17.py310:latest"
REGISTRIES = {"europe": "europe", "asia": "asia", "australia": "asia"}  # else "us"

_REGION = re.compile(r"[a-z]+(-[a-z]+)+[0-9]{1,2}")
_PROJECT = re.compile(r"([a-z][a-z0-9.\-]*[a-z0-9]:)?[a-z][a-z0-9\-]{4,28}[a-z0-9]|[0-9]+")
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")

# Machine names map through mljob/machines.py (the retired K80s are T4s there).
T4, RETIRED_ACCELERATORS = machines.T4, machines.RETIRED_ACCELERATORS
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
        image, account = self.options.image, self.options.service_account
        if image is not None and (not image or re.search(r"\s", image)):
            raise UsageError(f"--image {image!r} is not an image URI; pass one of Vertex's "
                             "prebuilt training images, e.g. " + _image(DEFAULT_REGION, False))
        if account is not None and not _EMAIL.fullmatch(account):
            raise UsageError(f"--service-account {account!r} is not a service account "
                             "email; write it like NAME@PROJECT.iam.gserviceaccount.com")
        for group in spec.groups:
            _machine_spec(spec, group)
        tuning = _tuning(spec)
        if tuning is not None and tuning.resume_from:
            raise UsageError("trainingInput.hyperparameters.resumePreviousJobId: a Vertex "
                             "AI HyperparameterTuningJob cannot continue an earlier study; "
                             "drop it (or tune with the local runner)")

    def render(self, spec: JobSpec, package: Package) -> Rendered:
        project, region = self._location(spec)
        parent = f"projects/{project}/locations/{region}"
        pools = [_pool(spec, spec.group(t), package, self.options.image, region)
                 if spec.group(t) else aiplatform_v1.WorkerPoolSpec() for t in POOLS]
        while not spec.group(POOLS[len(pools) - 1]):
            pools.pop()   # trailing empty pools are left out; pool 0 always exists
        job_spec = aiplatform_v1.CustomJobSpec(
            worker_pool_specs=pools,
            base_output_directory=aiplatform_v1.GcsDestination(
                output_uri_prefix=spec.job_dir))
        if self.options.service_account:
            job_spec.service_account = self.options.service_account
        if any(g.restart_policy != "Never" for g in spec.groups):
            # Vertex restarts a lost replica itself and has no per-exit-code policy; what
            # it can do is restart the whole job when a replica restarts, so every replica
            # resumes together from the latest checkpoint, as the trainer expects.
            job_spec.scheduling = aiplatform_v1.Scheduling(
                restart_job_on_worker_restart=True)
        handle = {"project": project, "region": region, "parent": parent,
                  "display_name": spec.job_id}
        tuning = _tuning(spec)
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

    def _location(self, spec: JobSpec) -> tuple[str, str]:
        project = self.options.project or next(
            (os.environ[k] for k in PROJECT_ENVS if os.environ.get(k)), None)
        if not project:
            raise UsageError("--runner vertex needs a Google Cloud project; pass --project "
                             "PROJECT_ID (or set GOOGLE_CLOUD_PROJECT)")
        if not _PROJECT.fullmatch(project):
            raise UsageError(f"--project {project!r} is not a Google Cloud project id; "
                             "pass one like my-project-123 (see `gcloud projects list`)")
        region = self.options.region or spec.training_input.get("region") or DEFAULT_REGION
        if not _REGION.fullmatch(region):
            raise UsageError(f"--region {region!r} is not a Google Cloud region; pass one "
                             f"like {DEFAULT_REGION} or europe-west4")
        return project, region

    # -- the API ------------------------------------------------------------------------

    def create(self, rendered: Rendered) -> Mapping[str, Any]:
        handle = dict(rendered.handle)
        with _api_errors(f"create job {handle['display_name']}", handle):
            client = _job_client(handle["region"])
            if handle.get("kind") == TUNING_KIND:
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
        with _api_errors(f"describe job {handle.get('display_name')}", handle):
            client = _job_client(handle["region"])
            get = (client.get_hyperparameter_tuning_job if handle.get("kind") == TUNING_KIND
                   else client.get_custom_job)
            job = get(name=handle["name"], timeout=CALL_TIMEOUT_S)
        state_name = getattr(job.state, "name", str(job.state))  # an int if unknown
        state, message = STATES.get(state_name, (jobs.RUNNING, None))
        if state == jobs.FAILED and job.error.message:
            message = _one_line(job.error.message)
        output = None
        if handle.get("kind") == TUNING_KIND:
            output = training_output(job)
        return EngineStatus(state=state, message=message, training_output=output)

    def cancel(self, handle: Mapping[str, Any]) -> str:
        with _api_errors(f"cancel job {handle.get('display_name')}", handle):
            client = _job_client(handle["region"])
            cancel = (client.cancel_hyperparameter_tuning_job
                      if handle.get("kind") == TUNING_KIND else client.cancel_custom_job)
            cancel(name=handle["name"], timeout=CALL_TIMEOUT_S)
        return jobs.CANCELLING

    def logs(self, handle: Mapping[str, Any], *, task_name: str | None = None,
             follow: bool = True) -> Iterator[str]:
        """Replica logs from Cloud Logging, as `gcloud ai custom-jobs stream-logs` reads
        them: resource type ml_job, the job's numeric id, one replica by its task name.
        Following polls from the last entry seen until the job has ended and a read finds
        nothing new (Logging may receive the last lines after the job ends); while the job
        runs, the last LOG_LAG_S seconds are left for the next read, as gcloud does, so
        that an entry that arrives late is not passed over."""
        job_id = handle["name"].rsplit("/", 1)[-1]
        filters = ['resource.type="ml_job"', f'resource.labels.job_id="{job_id}"']
        if task_name:
            filters.append(f'resource.labels.task_name="{vertex_task_name(task_name)}"')
        session, url = _logging_session()
        position = _Position()
        ended = False
        while True:
            if follow and not ended:
                ended = self.status(handle).state in jobs.FINAL_STATES
            window = [] if ended or not follow else \
                [f'timestamp<"{_rfc3339(time.time() - LOG_LAG_S)}"']
            new = 0
            for entry in _entries(session, url, handle, filters + position.bounds() + window):
                if position.advance(entry):
                    new += 1
                    yield from _format(entry)
            if not follow or (ended and not new):
                return
            time.sleep(self.poll_s)


def _pool(spec: JobSpec, group: specs.ReplicaGroup, package: Package, image: str | None,
          region: str) -> aiplatform_v1.WorkerPoolSpec:
    machine = _machine_spec(spec, group)
    return aiplatform_v1.WorkerPoolSpec(
        replica_count=group.count, machine_spec=machine,
        python_package_spec=aiplatform_v1.PythonPackageSpec(
            executor_image_uri=image or _image(region, bool(machine.accelerator_count)),
            package_uris=[package.url], python_module=spec.module_name,
            args=list(spec.trainer_args),
            env=[aiplatform_v1.EnvVar(name=JOB_ID_ENV, value=spec.job_id)]))


TRIAL_STATES = {"SUCCEEDED": jobs.SUCCEEDED, "INFEASIBLE": jobs.FAILED,
                "ACTIVE": jobs.RUNNING, "REQUESTED": jobs.QUEUED,
                "STOPPING": jobs.CANCELLING}


def training_output(job: aiplatform_v1.HyperparameterTuningJob) -> dict:
    """Vertex AI's trials as Cloud ML's trainingOutput, best first."""
    from submit import tuning
    metric = job.study_spec.metrics[0] if job.study_spec.metrics else None
    spec = tuning_spec.TuningSpec(
        goal="MINIMIZE" if metric and metric.goal.name == "MINIMIZE" else "MAXIMIZE",
        metric_tag=metric.metric_id if metric else "", max_trials=job.max_trial_count,
        max_parallel_trials=job.parallel_trial_count, max_failed_trials=None,
        early_stopping=False, resume_from=None, algorithm="ALGORITHM_UNSPECIFIED",
        params=())
    trials = []
    for t in job.trials:
        out = {"trialId": t.id, "state": TRIAL_STATES.get(t.state.name, jobs.RUNNING),
               "hyperparameters": {p.parameter_id: _value_text(p.value)
                                   for p in t.parameters},
               "allMetrics": [m for m in (_metric(x, spec.metric_tag)
                                          for x in t.measurements) if m],
               "isTrialStoppedEarly": False}
        final = _metric(t.final_measurement, spec.metric_tag) if "final_measurement" in t \
            else None
        if final:
            out["finalMetric"] = final
        for key, stamp in (("startTime", t.start_time), ("endTime", t.end_time)):
            if stamp:
                out[key] = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
        if t.infeasible_reason:
            out["errorMessage"] = _one_line(t.infeasible_reason)
        trials.append(out)
    return tuning.output_of(trials, spec)


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


def _tuning(spec: JobSpec) -> tuning_spec.TuningSpec | None:
    hp = spec.training_input.get("hyperparameters")
    return None if hp is None else tuning_spec.parse(hp, job_dir=spec.job_dir)


def study_spec(tuning: tuning_spec.TuningSpec) -> aiplatform_v1.StudySpec:
    """Cloud ML's HyperparameterSpec as Vertex AI's StudySpec: the same metric, goal,
    parameters, scale types and algorithm; early stopping is Vertex's median rule (the
    local runner's too)."""
    study = aiplatform_v1.StudySpec
    params = []
    for p in tuning.params:
        param = study.ParameterSpec(parameter_id=p.name)
        if p.type == "DOUBLE":
            param.double_value_spec = study.ParameterSpec.DoubleValueSpec(
                min_value=float(p.low), max_value=float(p.high))
        elif p.type == "INTEGER":
            param.integer_value_spec = study.ParameterSpec.IntegerValueSpec(
                min_value=int(p.low), max_value=int(p.high))
        elif p.type == "CATEGORICAL":
            param.categorical_value_spec = study.ParameterSpec.CategoricalValueSpec(
                values=list(p.values))
        else:
            param.discrete_value_spec = study.ParameterSpec.DiscreteValueSpec(
                values=[float(v) for v in p.values])
        if p.type in ("DOUBLE", "INTEGER"):
            param.scale_type = study.ParameterSpec.ScaleType[p.scale]
        params.append(param)
    out = study(metrics=[study.MetricSpec(metric_id=tuning.metric_tag,
                                          goal=study.MetricSpec.GoalType[tuning.goal])],
                parameters=params, algorithm=study.Algorithm[tuning.algorithm])
    if tuning.early_stopping:
        out.median_automated_stopping_spec = study.MedianAutomatedStoppingSpec(
            use_elapsed_duration=False)
    return out


def _machine_spec(spec: JobSpec, group: specs.ReplicaGroup) -> aiplatform_v1.MachineSpec:
    """The group's machine: its legacy name's equivalent (n1-* names pass through), with
    `<type>Config.acceleratorConfig` overriding the accelerator's type and count."""
    key = specs.CONFIG_KEYS[group.task_type]
    accel = (spec.training_input.get(key) or {}).get("acceleratorConfig") or {}
    entry = machines.lookup(group.machine_type)
    machine_type, accel_type, count = entry.gce_type, entry.accelerator, entry.gpus
    accel_type = accel.get("type") or accel_type
    count = accel.get("count") or count or (1 if accel_type else 0)
    machine = aiplatform_v1.MachineSpec(machine_type=machine_type)
    if count:
        accel_type = accel_type or T4
        if accel_type in RETIRED_ACCELERATORS:
            raise UsageError(f"trainingInput.{key}.acceleratorConfig.type {accel_type} is "
                             "retired on Vertex AI; use "
                             f"{RETIRED_ACCELERATORS[accel_type]} or another current GPU")
        try:
            machine.accelerator_type = aiplatform_v1.AcceleratorType[accel_type]
        except KeyError:
            known = [a.name for a in aiplatform_v1.AcceleratorType
                     if a.name.startswith("NVIDIA") and a.name not in RETIRED_ACCELERATORS]
            raise UsageError(f"trainingInput.{key}.acceleratorConfig.type {accel_type!r} is "
                             f"not a Vertex AI accelerator; use one of {', '.join(known)}") \
                from None
        machine.accelerator_count = count
    return machine


def _image(region: str, gpu: bool) -> str:
    registry = REGISTRIES.get(region.split("-", 1)[0], "us")
    return IMAGE.format(registry=registry, kind="gpu" if gpu else "cpu")


def _labels(spec: JobSpec, package: Package) -> dict[str, str]:
    """Vertex label values are at most 63 lower-case letters, digits, `_` and `-`: job ids
    are letters, digits and `_`, so lower-casing is enough (display_name keeps the case)."""
    return {"mljob-job-id": spec.job_id.lower()[:63],
            "mljob-scale-tier": spec.scale_tier.lower(),
            "mljob-package-sha256": package.sha256[:16]}


def _to_json(request) -> str:
    """The request as the REST API takes it: camelCase, enums by name, only fields that
    are set, keys sorted so that --dry-run prints the same text for the same job."""
    return json_format.MessageToJson(type(request).pb(request), sort_keys=True, indent=2)


def vertex_task_name(label: str) -> str:
    """`master-replica-0` -> `workerpool0-0` (Vertex's names pass through)."""
    if re.fullmatch(r"workerpool[0-3]-\d+|service", label):
        return label
    parsed = contracts.parse_label(label)
    if parsed is None:
        raise UsageError(f"--task-name {label!r} names no replica; use "
                         f"{contracts.LABEL_HINT}")
    return f"workerpool{contracts.vertex_pool(parsed[0])}-{parsed[1]}"


def replica_label(task_name: str) -> str:
    """`workerpool1-3` -> `worker-replica-3`, as Cloud ML labelled replicas."""
    match = re.fullmatch(r"workerpool([0-3])-(\d+)", task_name)
    return contracts.replica_label(POOLS[int(match[1])], match[2]) if match else task_name


# -- clients and errors ----------------------------------------------------------------

def _job_client(region: str) -> aiplatform_v1.JobServiceClient:
    endpoint = os.environ.get(VERTEX_ENDPOINT_ENV)
    credentials = AnonymousCredentials() if endpoint else None  # None: ADC
    return aiplatform_v1.JobServiceClient(
        credentials=credentials, transport="rest",
        client_options={"api_endpoint": endpoint or f"{region}-aiplatform.googleapis.com"})


def _logging_session() -> tuple[AuthorizedSession, str]:
    endpoint = os.environ.get(LOGGING_ENDPOINT_ENV)
    if endpoint:
        credentials = AnonymousCredentials()
    else:
        with _api_errors("read the job's logs", {}):
            credentials, _ = google.auth.default(
                scopes=["https://www.googleapis.com/auth/logging.read"])
    return AuthorizedSession(credentials), f"{(endpoint or LOGGING_API).rstrip('/')}" \
                                           "/v2/entries:list"


FIXES = {400: "check the request --dry-run prints", 401: "run `gcloud auth "
         "application-default login`", 403: "run `gcloud auth application-default login` "
         "with an account that has roles/aiplatform.user (and roles/logging.viewer for "
         "logs) in the project, and enable the Vertex AI API", 404: "check --project and "
         "--region, and that the job exists", 409: "pick another job id",
         429: "wait a minute or ask for more quota"}


@contextlib.contextmanager
def _api_errors(action: str, handle: Mapping[str, Any]):
    """Google API and credential errors -> one-line SubmitError naming the fix."""
    where = f" in project {handle['project']} region {handle['region']}" \
        if handle.get("project") else ""
    try:
        yield
    except auth_exceptions.DefaultCredentialsError as exc:
        raise SubmitError(f"cannot {action}: no Application Default Credentials "
                          f"({_one_line(str(exc))[:160]}); run `gcloud auth "
                          "application-default login` or set GOOGLE_APPLICATION_CREDENTIALS "
                          "to a service account key file") from None
    except (auth_exceptions.GoogleAuthError, requests.RequestException) as exc:
        raise SubmitError(f"cannot {action}{where}: {_one_line(str(exc))[:300]}; check the "
                          "network and run `gcloud auth application-default login`") from None
    except api_exceptions.GoogleAPICallError as exc:
        code = int(exc.code) if exc.code else 0
        message = re.sub(r"^[A-Z]+ \S+: ", "", exc.message or str(exc))  # drop method, URL
        fix = FIXES.get(code, "try again later" if code >= 500 else "see the message")
        raise SubmitError(f"Vertex AI refused to {action}{where}: {code} "
                          f"{_one_line(message)[:300]}; {fix}") from None
    except api_exceptions.GoogleAPIError as exc:  # retries ran out, and the like
        raise SubmitError(f"cannot {action}{where}: {_one_line(str(exc))[:300]}; try again "
                          "later") from None


def _one_line(text: str) -> str:
    return " ".join(text.split())


# -- Cloud Logging ---------------------------------------------------------------------

def _entries(session: AuthorizedSession, url: str, handle: Mapping[str, Any],
             filters: list[str]) -> Iterator[dict]:
    body: dict[str, Any] = {"resourceNames": [f"projects/{handle['project']}"],
                            "filter": " AND ".join(filters), "orderBy": "timestamp asc",
                            "pageSize": 1000}
    while True:
        with _api_errors(f"read the logs of job {handle.get('display_name')}", handle):
            response = session.post(url, json=body, timeout=CALL_TIMEOUT_S)
        if response.status_code >= 400:
            raise SubmitError(f"Cloud Logging refused to read the logs of job "
                              f"{handle.get('display_name')}: {response.status_code} "
                              f"{_logging_error(response)}; "
                              f"{FIXES.get(response.status_code, 'try again later')}")
        page = response.json()
        yield from page.get("entries", ())
        if not page.get("nextPageToken"):
            return
        body["pageToken"] = page["nextPageToken"]


def _logging_error(response: requests.Response) -> str:
    try:
        return _one_line(str(response.json()["error"]["message"]))[:300]
    except (ValueError, KeyError, TypeError):
        return _one_line(response.text)[:300] or response.reason


class _Position:
    """The last entry read (timestamp, insertId): reads ask only for later entries, and
    entries at or before it (a page read twice) are skipped."""

    def __init__(self):
        self.key: tuple[str, str] | None = None

    def bounds(self) -> list[str]:
        if self.key is None:
            return []
        stamp, insert_id = self.key
        return [f'(timestamp>"{stamp}" OR (timestamp="{stamp}" AND '
                f'insertId>"{insert_id}"))']

    def advance(self, entry: Mapping[str, Any]) -> bool:
        key = (_timestamp(entry.get("timestamp", "")), str(entry.get("insertId", "")))
        if self.key is not None and key <= self.key:
            return False
        self.key = key
        return True


def _rfc3339(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when)) + \
        f".{int(when % 1 * 1e9):09d}Z"


def _timestamp(stamp: str) -> str:
    """RFC 3339 in UTC with nine fraction digits, so that string order is time order."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z", stamp)
    return f"{match[1]}.{(match[2] or '').ljust(9, '0')}Z" if match else stamp


def _format(entry: Mapping[str, Any]) -> Iterator[str]:
    task = (entry.get("resource", {}).get("labels", {}).get("task_name")
            or entry.get("labels", {}).get("ml.googleapis.com/task_name") or "service")
    payload = entry.get("jsonPayload")
    text = str(payload.get("message") or "") if isinstance(payload, dict) \
        else str(entry.get("textPayload") or "")
    severity = entry.get("severity") or "DEFAULT"
    severity = "INFO" if severity == "DEFAULT" else severity   # as the local runner's
    stamp = entry.get("timestamp", "")
    when = calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) \
        if re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", stamp) else None
    for line in text.splitlines() or [""]:
        yield logs.format_line(replica_label(task), line, severity, when)
