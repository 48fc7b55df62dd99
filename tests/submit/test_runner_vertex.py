"""The Vertex AI engine: the CustomJob it renders (against golden files, and parsed back
through the client library's own types), the checks that refuse what Vertex cannot run,
and its client calls (create, status, cancel, Cloud Logging reads) sent by the real
google-cloud-aiplatform and google-auth clients over HTTP to a recording endpoint on
127.0.0.1 (tests/api_edge.py), which answers as the APIs document.

Golden files: tests/golden/vertex_*.json hold `Rendered.text` (what --dry-run prints).
After an intended change to the rendered job, rewrite them with
    MLJOB_UPDATE_GOLDEN=1 python -m pytest -q tests/test_runner_vertex.py
and review the diff.
"""
from __future__ import annotations

import json
import os
import re

import pytest
from google.cloud import aiplatform_v1
from google.protobuf import json_format

from tests.support.api_edge import ApiEdge
from tests.support.common import ROOT
from submit import jobs, runners
from submit.jobdef import spec as specs
from submit.errors import SubmitError, UsageError
from submit.packaging.package import Package
from submit.runners import vertex
from submit.__main__ import main
from submit.runners.engine import EngineOptions
from submit.runners.vertex import VertexEngine

GOLDEN = os.path.join(ROOT, "tests", "golden")
SHA = "0" * 64
PACKAGE = Package(file_name="mljob-0.1.0.tar.gz", sha256=SHA, top_dir="mljob-0.1.0",
                  url=f"gs://mljob-staging/job01/{SHA}/mljob-0.1.0.tar.gz")
JOB_DIR = "gs://mljob-test/job01"
ARGS = ["--model", "mlp", "--train-steps", "200"]
CUSTOM = {"scaleTier": "CUSTOM", "masterType": "standard", "workerType": "complex_model_m",
          "parameterServerType": "large_model", "evaluatorType": "n1-highcpu-8",
          "workerCount": 2, "parameterServerCount": 1, "evaluatorCount": 1,
          "workerConfig": {"acceleratorConfig": {"count": 2, "type": "NVIDIA_TESLA_T4"}},
          "masterConfig": {"restartPolicy": "OnFailure", "maxRestarts": 3}}
HP = {"goal": "MAXIMIZE", "hyperparameterMetricTag": "accuracy", "maxTrials": 8,
      "maxParallelTrials": 2, "maxFailedTrials": 3, "enableTrialEarlyStopping": True,
      "params": [{"parameterName": "learning_rate", "type": "DOUBLE", "minValue": 1e-4,
                  "maxValue": 0.1, "scaleType": "UNIT_LOG_SCALE"},
                 {"parameterName": "hidden_units", "type": "INTEGER", "minValue": 16,
                  "maxValue": 256, "scaleType": "UNIT_REVERSE_LOG_SCALE"},
                 {"parameterName": "model", "type": "CATEGORICAL",
                  "categoricalValues": ["cnn", "mlp"]},
                 {"parameterName": "batch_size", "type": "DISCRETE",
                  "discreteValues": [32, 64, 128]}]}
TUNING = {**CUSTOM, "hyperparameters": HP}
ENGINE_KEYS = {  # Vertex AI's keys in config.yaml (submit/jobdef/engine_keys.py)
    "serviceAccount": "trainer@mljob-test.iam.gserviceaccount.com",
    "network": "projects/123456789/global/networks/ml-vpc", "enableWebAccess": True,
    "tensorboard": "projects/mljob-test/locations/us-central1/tensorboards/4242",
    "baseOutputDirectory": "gs://mljob-test/outputs/job01",
    "scheduling": {"strategy": "SPOT", "maxRunningTime": "7200s"}}
PARENT = "projects/mljob-test/locations/us-central1"
NAME = "projects/123456789/locations/us-central1/customJobs/7200000000000000001"
JOB_PATH = "/v1/" + NAME
LOGS_PATH = "/v2/entries:list"


@pytest.fixture(autouse=True)
def _no_ambient_cloud(monkeypatch, tmp_path):
    """Nothing from this machine's environment: no project, no endpoints, no gcloud."""
    for name in (*vertex.PROJECT_ENVS, vertex.VERTEX_ENDPOINT_ENV, vertex.LOGGING_ENDPOINT_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))


def engine(**options) -> VertexEngine:
    options.setdefault("project", "mljob-test")
    return VertexEngine(EngineOptions(**options))


def resolve(training_input=None, job_id="job01", **flags) -> specs.JobSpec:
    flags.setdefault("job_dir", JOB_DIR)
    flags.setdefault("args", ARGS)
    return specs.resolve(specs.Flags(job_id, **flags),
                         specs.training_config(training_input or {}))


def render(training_input=None, **flags):
    spec = resolve(training_input, **flags)
    vertex_engine = engine()
    vertex_engine.check(spec)
    return vertex_engine.render(spec, PACKAGE)


def pools(rendered) -> list[dict]:
    return rendered.body["customJob"]["jobSpec"]["workerPoolSpecs"]


# -- rendering ---------------------------------------------------------------------------

@pytest.mark.parametrize("golden, training_input, flags", [
    ("vertex_standard_1", {}, {"scale_tier": "STANDARD_1"}),
    ("vertex_custom_evaluator", CUSTOM, {}),
    ("vertex_tuning", TUNING, {}),
    ("vertex_engine_keys", {**CUSTOM, **ENGINE_KEYS}, {}),
])
def test_rendered_job_matches_golden_file(golden, training_input, flags):
    text = render(training_input, **flags).text + "\n"
    path = os.path.join(GOLDEN, golden + ".json")
    if os.environ.get("MLJOB_UPDATE_GOLDEN") == "1":
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    with open(path) as f:
        assert text == f.read(), f"rendered job differs from {path}; see the docstring"


def test_tuning_job_is_a_hyperparameter_tuning_job_around_the_custom_job():
    rendered = render(TUNING)
    request = aiplatform_v1.CreateHyperparameterTuningJobRequest.from_json(rendered.text)
    job = request.hyperparameter_tuning_job
    assert (job.max_trial_count, job.parallel_trial_count, job.max_failed_trial_count) == \
        (8, 2, 3)
    study = job.study_spec
    assert [(m.metric_id, m.goal.name) for m in study.metrics] == [("accuracy", "MAXIMIZE")]
    assert study.algorithm.name == "ALGORITHM_UNSPECIFIED"
    lr, units, model, batch = study.parameters
    assert (lr.parameter_id, lr.double_value_spec.min_value, lr.scale_type.name) == \
        ("learning_rate", 1e-4, "UNIT_LOG_SCALE")
    assert (units.integer_value_spec.max_value, units.scale_type.name) == \
        (256, "UNIT_REVERSE_LOG_SCALE")
    assert list(model.categorical_value_spec.values) == ["cnn", "mlp"]
    assert list(batch.discrete_value_spec.values) == [32.0, 64.0, 128.0]
    assert rendered.body["hyperparameterTuningJob"]["studySpec"][
        "medianAutomatedStoppingSpec"] == {}  # set: Vertex's median stopping rule
    # the trial job is exactly the CustomJob the same config renders without tuning
    plain = aiplatform_v1.CreateCustomJobRequest.from_json(render(CUSTOM).text)
    assert job.trial_job_spec == plain.custom_job.job_spec
    assert rendered.handle["kind"] == "hyperparameterTuningJob"
    without = render({**CUSTOM, "hyperparameters": {**HP, "maxFailedTrials": None,
                                                    "enableTrialEarlyStopping": False,
                                                    "algorithm": "RANDOM_SEARCH"}})
    study = without.body["hyperparameterTuningJob"]["studySpec"]
    assert "medianAutomatedStoppingSpec" not in study and study["algorithm"] == \
        "RANDOM_SEARCH"
    assert "maxFailedTrialCount" not in without.body["hyperparameterTuningJob"]


def test_tuning_resume_is_refused_on_vertex():
    with pytest.raises(UsageError, match="cannot continue an earlier study; drop it"):
        render({"hyperparameters": {**HP, "resumePreviousJobId": "tune01"}})


def test_registry_loads_the_vertex_engine():
    assert runners.get("vertex") is VertexEngine
    assert VertexEngine.name == "vertex"


def test_request_parses_back_through_the_library_types_unchanged():
    rendered = render(CUSTOM)
    request = aiplatform_v1.CreateCustomJobRequest.from_json(rendered.text)
    assert vertex._to_json(request) == rendered.text
    assert rendered.body == json.loads(rendered.text)
    # a misspelt field is refused by the library, so the check above means something
    broken = rendered.text.replace('"replicaCount"', '"replicaCuont"', 1)
    with pytest.raises(json_format.ParseError, match="replicaCuont"):
        aiplatform_v1.CreateCustomJobRequest.from_json(broken)


def test_custom_job_fields():
    rendered = render(CUSTOM)
    job = rendered.body["customJob"]
    assert rendered.body["parent"] == PARENT
    assert job["displayName"] == "job01"
    assert job["jobSpec"]["baseOutputDirectory"] == {"outputUriPrefix": JOB_DIR}
    assert job["jobSpec"]["scheduling"] == {"restartJobOnWorkerRestart": True}
    assert job["labels"] == {"mljob-job-id": "job01", "mljob-scale-tier": "custom",
                             "mljob-package-sha256": SHA[:16]}
    chief, workers, ps, evaluators = pools(rendered)
    assert [p["replicaCount"] for p in (chief, workers, ps, evaluators)] == \
        ["1", "2", "1", "1"]
    assert [p["machineSpec"]["machineType"] for p in (chief, workers, ps, evaluators)] \
        == ["n1-standard-4", "n1-highcpu-16", "n1-highmem-8", "n1-highcpu-8"]
    assert workers["machineSpec"]["acceleratorType"] == "NVIDIA_TESLA_T4"
    assert workers["machineSpec"]["acceleratorCount"] == 2
    assert "acceleratorType" not in chief["machineSpec"]
    for pool in (chief, workers, ps, evaluators):
        package = pool["pythonPackageSpec"]
        assert package["packageUris"] == [PACKAGE.url]
        # the module run by mljob's launcher, as `python -m` runs it
        assert package["pythonModule"] == "mljob.fitting.launch"
        assert package["args"] == ["trainer.task", *ARGS, "--job-dir", JOB_DIR]
        assert package["env"] == [{"name": "MLJOB_JOB_ID", "value": "job01"}]
    assert workers["pythonPackageSpec"]["executorImageUri"] == \
        "us-docker.pkg.dev/vertex-ai/training/tf-gpu.2-17.py310:latest"
    assert chief["pythonPackageSpec"]["executorImageUri"] == \
        "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-17.py310:latest"
    assert rendered.handle == {"project": "mljob-test", "region": "us-central1",
                               "parent": PARENT, "display_name": "job01"}


def test_skipped_middle_pools_are_empty_and_trailing_ones_left_out():
    chief_evaluator = {"scaleTier": "CUSTOM", "masterType": "standard", "evaluatorCount": 1}
    shown = pools(render(chief_evaluator))
    assert [bool(p) for p in shown] == [True, False, False, True]
    assert shown[3]["replicaCount"] == "1"
    assert len(pools(render({}, scale_tier="BASIC"))) == 1
    assert len(pools(render({**CUSTOM, "evaluatorCount": 0}))) == 3
    never = render({**CUSTOM, "masterConfig": {}})
    assert "scheduling" not in never.body["customJob"]["jobSpec"]


@pytest.mark.parametrize("machine, expected", [
    ("standard", ("n1-standard-4", None, None)),
    ("large_model", ("n1-highmem-8", None, None)),
    ("complex_model_s", ("n1-highcpu-8", None, None)),
    ("complex_model_l", ("n1-highcpu-32", None, None)),
    ("standard_gpu", ("n1-standard-8", "NVIDIA_TESLA_T4", 1)),
    ("complex_model_m_gpu", ("n1-standard-16", "NVIDIA_TESLA_T4", 4)),
    ("complex_model_l_gpu", ("n1-standard-32", "NVIDIA_TESLA_T4", 4)),
    ("complex_model_m_p100", ("n1-standard-16", "NVIDIA_TESLA_P100", 4)),
    ("large_model_v100", ("n1-highmem-8", "NVIDIA_TESLA_V100", 1)),
    ("complex_model_l_v100", ("n1-standard-32", "NVIDIA_TESLA_V100", 8)),
    ("n1-highcpu-16", ("n1-highcpu-16", None, None)),
])
def test_machine_mapping(machine, expected):
    spec = pools(render({"scaleTier": "CUSTOM", "masterType": machine}))[0]["machineSpec"]
    assert (spec["machineType"], spec.get("acceleratorType"),
            spec.get("acceleratorCount")) == expected


def test_every_legacy_machine_name_is_mapped():
    for machine in specs.MACHINE_TYPES:
        spec = pools(render({"scaleTier": "CUSTOM", "masterType": machine}))[0]["machineSpec"]
        assert spec["machineType"].startswith("n1-"), machine


def test_accelerator_config_overrides_type_and_count_and_basic_gpu_gets_one():
    config = {"scaleTier": "CUSTOM", "masterType": "complex_model_m_gpu",
              "masterConfig": {"acceleratorConfig": {"type": "NVIDIA_L4"}}}
    machine = pools(render(config))[0]["machineSpec"]
    assert (machine["acceleratorType"], machine["acceleratorCount"]) == ("NVIDIA_L4", 4)
    machine = pools(render({}, scale_tier="BASIC_GPU"))[0]["machineSpec"]
    assert (machine["acceleratorType"], machine["acceleratorCount"]) == \
        ("NVIDIA_TESLA_T4", 1)


def test_options_reach_the_job():
    spec = resolve({"region": "europe-west4"}, scale_tier="BASIC_GPU")
    rendered = engine(service_account="trainer@mljob-test.iam.gserviceaccount.com") \
        .render(spec, PACKAGE)
    job_spec = rendered.body["customJob"]["jobSpec"]
    assert job_spec["serviceAccount"] == "trainer@mljob-test.iam.gserviceaccount.com"
    assert rendered.body["parent"] == "projects/mljob-test/locations/europe-west4"
    assert job_spec["workerPoolSpecs"][0]["pythonPackageSpec"]["executorImageUri"] == \
        "europe-docker.pkg.dev/vertex-ai/training/tf-gpu.2-17.py310:latest"
    image = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-16.py310:latest"
    rendered = engine(image=image, region="us-east1").render(spec, PACKAGE)
    assert pools(rendered)[0]["pythonPackageSpec"]["executorImageUri"] == image
    assert rendered.handle["region"] == "us-east1"


def test_project_from_the_environment(monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_PROJECT", "from-gcloud-config")
    assert engine(project=None).render(resolve(), PACKAGE).handle["project"] == \
        "from-gcloud-config"
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "from-environment")
    assert engine(project=None).render(resolve(), PACKAGE).handle["project"] == \
        "from-environment"


# -- check -------------------------------------------------------------------------------

def refused(vertex_engine: VertexEngine, spec: specs.JobSpec) -> str:
    with pytest.raises(UsageError) as info:
        vertex_engine.check(spec)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_job_dir_must_be_gs(tmp_path):
    assert refused(engine(), resolve(job_dir=None, staging_bucket="gs://mljob-staging")) \
        == ("--runner vertex needs --job-dir gs://BUCKET/PATH: it becomes the job's base "
            "output directory, which every replica writes")
    local = str(tmp_path / "job01")
    assert refused(engine(), resolve(job_dir=local)) == (
        f"--job-dir {local} cannot be reached by Vertex AI replicas; use a "
        "gs://BUCKET/PATH job dir with --runner vertex")
    assert refused(engine(), resolve(job_dir="memory://jobs/job01")).startswith(
        "--job-dir memory://jobs/job01 cannot be reached by Vertex AI replicas")


def test_staging_must_be_gs(tmp_path):
    assert refused(engine(), resolve(staging_bucket=str(tmp_path))) == (
        f"--staging-bucket {tmp_path} cannot be read by Vertex AI; use a gs://BUCKET, or "
        "drop it to stage under --job-dir")
    staged = resolve({"packageUris": [f"file://{tmp_path}/mljob-0.1.0.tar.gz"]})
    assert refused(engine(), staged).startswith(
        f"trainingInput.packageUris file://{tmp_path}/mljob-0.1.0.tar.gz cannot be read by "
        "Vertex AI; stage the package to gs://")
    engine().check(resolve({"packageUris": [PACKAGE.url]}))


def test_project_region_and_options_are_checked():
    assert refused(engine(project=None), resolve()) == (
        "--runner vertex needs a Google Cloud project; pass --project PROJECT_ID (or set "
        "GOOGLE_CLOUD_PROJECT)")
    assert refused(engine(project="My Project"), resolve()).startswith(
        "--project 'My Project' is not a Google Cloud project id; pass one like")
    assert refused(engine(region="us central1"), resolve()) == (
        "--region 'us central1' is not a Google Cloud region; pass one like us-central1 "
        "or europe-west4")
    assert refused(engine(service_account="trainer"), resolve()).startswith(
        "--service-account 'trainer' is not a service account email")
    assert refused(engine(image="tf cpu"), resolve()).startswith(
        "--image 'tf cpu' is not an image URI")
    engine(project="123456789012", region="asia-southeast1").check(resolve())


def test_accelerators_are_checked():
    k80 = {"scaleTier": "CUSTOM", "masterType": "standard",
           "masterConfig": {"acceleratorConfig": {"count": 1, "type": "NVIDIA_TESLA_K80"}}}
    assert refused(engine(), resolve(k80)) == (
        "trainingInput.masterConfig.acceleratorConfig.type NVIDIA_TESLA_K80 is retired on "
        "Vertex AI; use NVIDIA_TESLA_T4 or another current GPU")
    typo = {**k80, "masterConfig": {"acceleratorConfig": {"count": 1, "type": "T4"}}}
    assert refused(engine(), resolve(typo)).startswith(
        "trainingInput.masterConfig.acceleratorConfig.type 'T4' is not a Vertex AI "
        "accelerator; use one of NVIDIA_TESLA_P100, ")


def test_options_of_another_runner_are_refused():
    with pytest.raises(UsageError, match=r"^--namespace is for --runner kubeflow, not "
                                         r"--runner vertex"):
        VertexEngine(EngineOptions(namespace="ml"))


def test_task_names():
    assert vertex.vertex_task_name("master-replica-0") == "workerpool0-0"
    assert vertex.vertex_task_name("evaluator-replica-0") == "workerpool3-0"
    assert vertex.vertex_task_name("workerpool1-2") == "workerpool1-2"
    assert vertex.replica_label("workerpool2-1") == "ps-replica-1"
    with pytest.raises(UsageError, match="--task-name 'chief-0' names no replica"):
        vertex.vertex_task_name("chief-0")


# -- the API, over HTTP ------------------------------------------------------------------

@pytest.fixture(scope="module")
def edge():
    with ApiEdge() as server:   # one per module: stopping one takes half a second
        yield server


@pytest.fixture
def api(edge, monkeypatch):
    """The recording endpoint, with no routes and no requests yet, as both APIs."""
    edge.routes.clear()
    edge.requests.clear()
    monkeypatch.setenv(vertex.VERTEX_ENDPOINT_ENV, edge.url)
    monkeypatch.setenv(vertex.LOGGING_ENDPOINT_ENV, edge.url)
    return edge


HANDLE = {"project": "mljob-test", "region": "us-central1", "parent": PARENT,
          "display_name": "job01", "name": NAME, "id": NAME.rsplit("/", 1)[1]}
PERMISSION_DENIED = {"error": {"code": 403, "status": "PERMISSION_DENIED", "message":
                               "Permission 'aiplatform.customJobs.create' denied on "
                               "resource '//aiplatform.googleapis.com/projects/mljob-test'"}}


def test_create_sends_the_rendered_job(api):
    rendered = render(CUSTOM)
    api.route("POST", f"/v1/{PARENT}/customJobs", 200,
              {"name": NAME, "displayName": "job01", "state": "JOB_STATE_QUEUED"})
    handle = engine().create(rendered)
    assert handle == HANDLE
    (request,) = api.requests
    assert (request.method, request.path) == ("POST", f"/v1/{PARENT}/customJobs")
    sent = aiplatform_v1.CustomJob.from_json(request.body)  # enums go as numbers
    assert sent == aiplatform_v1.CreateCustomJobRequest.from_json(rendered.text).custom_job
    assert request.json()["jobSpec"]["workerPoolSpecs"][1]["replicaCount"] == "2"
    assert "authorization" not in request.headers  # anonymous credentials


def test_create_refused_is_one_line_with_the_fix(api):
    api.route("POST", f"/v1/{PARENT}/customJobs", 403, PERMISSION_DENIED)
    with pytest.raises(SubmitError) as info:
        engine().create(render())
    message = str(info.value)
    assert message.startswith(
        "Vertex AI refused to create job job01 in project mljob-test region us-central1: "
        "403 Permission 'aiplatform.customJobs.create' denied on resource")
    assert message.endswith("run `gcloud auth application-default login` with an account "
                            "that has roles/aiplatform.user (and roles/logging.viewer for "
                            "logs) in the project, and enable the Vertex AI API")
    assert "\n" not in message and "127.0.0.1" not in message
    assert info.value.exit_status == 1


def test_missing_credentials_are_one_line_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    for call in (lambda: engine().create(render()),
                 lambda: list(engine().logs(HANDLE, follow=False))):
        with pytest.raises(SubmitError) as info:
            call()
        message = str(info.value)
        assert "no Application Default Credentials" in message and "\n" not in message
        assert "run `gcloud auth application-default login`" in message


@pytest.mark.parametrize("vertex_state, state", [
    ("JOB_STATE_QUEUED", jobs.QUEUED), ("JOB_STATE_PENDING", jobs.PREPARING),
    ("JOB_STATE_RUNNING", jobs.RUNNING), ("JOB_STATE_SUCCEEDED", jobs.SUCCEEDED),
    ("JOB_STATE_FAILED", jobs.FAILED), ("JOB_STATE_CANCELLING", jobs.CANCELLING),
    ("JOB_STATE_CANCELLED", jobs.CANCELLED), ("JOB_STATE_PAUSED", jobs.QUEUED),
    ("JOB_STATE_EXPIRED", jobs.FAILED),
])
def test_status_maps_vertex_states(api, vertex_state, state):
    job = {"name": NAME, "displayName": "job01", "state": vertex_state}
    if vertex_state == "JOB_STATE_FAILED":
        job["error"] = {"code": 3, "message": "The replica workerpool0-0 exited with a "
                                              "non-zero status of 1.\nTo find out more..."}
    api.route("GET", JOB_PATH, 200, job)
    status = engine(project=None).status(HANDLE)   # describe knows only the handle
    assert status.state == state
    assert api.requests[0].method == "GET" and api.requests[0].path == JOB_PATH
    if state == jobs.FAILED and vertex_state == "JOB_STATE_FAILED":
        assert status.message == ("The replica workerpool0-0 exited with a non-zero "
                                  "status of 1. To find out more...")


def test_status_of_a_missing_job(api):
    api.route("GET", JOB_PATH, 404, {"error": {"code": 404, "status": "NOT_FOUND",
                                               "message": "CustomJob not found."}})
    with pytest.raises(SubmitError, match=r"^Vertex AI refused to describe job job01 in "
                                          r"project mljob-test region us-central1: 404 "
                                          r"CustomJob not found\.; check --project"):
        engine().status(HANDLE)


TUNING_NAME = "projects/123456789/locations/us-central1/hyperparameterTuningJobs/42"


def test_tuning_job_is_created_described_and_cancelled_as_one(api):
    rendered = render(TUNING)
    api.route("POST", f"/v1/{PARENT}/hyperparameterTuningJobs", 200,
              {"name": TUNING_NAME, "displayName": "job01", "state": "JOB_STATE_QUEUED"})
    handle = engine().create(rendered)
    assert handle["name"] == TUNING_NAME and handle["kind"] == "hyperparameterTuningJob"
    sent = aiplatform_v1.HyperparameterTuningJob.from_json(api.requests[0].body)
    assert sent == aiplatform_v1.CreateHyperparameterTuningJobRequest.from_json(
        rendered.text).hyperparameter_tuning_job
    api.route("GET", "/v1/" + TUNING_NAME, 200, {"name": TUNING_NAME,
                                                 "state": "JOB_STATE_RUNNING"})
    assert engine(project=None).status(handle).state == jobs.RUNNING
    api.route("POST", "/v1/" + TUNING_NAME + ":cancel", 200, {})
    assert engine(project=None).cancel(handle) == jobs.CANCELLING
    assert [r.path for r in api.requests] == [
        f"/v1/{PARENT}/hyperparameterTuningJobs", "/v1/" + TUNING_NAME,
        "/v1/" + TUNING_NAME + ":cancel"]


def test_tuning_trials_become_cloud_ml_training_output_best_first(api):
    def trial(n, state, lr, accuracy=None, step="200"):
        out = {"id": str(n), "state": state, "startTime": "2026-11-23T10:00:00Z",
               "parameters": [{"parameterId": "learning_rate", "value": lr},
                              {"parameterId": "batch_size", "value": 64.0}]}
        if accuracy is not None:
            out["finalMeasurement"] = {"stepCount": step, "metrics": [
                {"metricId": "accuracy", "value": accuracy}]}
            out["measurements"] = [{"stepCount": "100", "metrics": [
                {"metricId": "accuracy", "value": accuracy / 2}]}]
        return out
    job = {"name": TUNING_NAME, "state": "JOB_STATE_RUNNING",
           "studySpec": {"metrics": [{"metricId": "accuracy", "goal": "MAXIMIZE"}]},
           "trials": [trial(1, "SUCCEEDED", 0.01, 0.71), trial(2, "SUCCEEDED", 0.1, 0.83),
                      trial(3, "INFEASIBLE", 0.5), trial(4, "ACTIVE", 0.2)]}
    api.route("GET", "/v1/" + TUNING_NAME, 200, job)
    handle = {**HANDLE, "name": TUNING_NAME, "kind": "hyperparameterTuningJob"}
    output = engine(project=None).status(handle).training_output
    assert output["isHyperparameterTuningJob"] and output["completedTrialCount"] == "2"
    assert output["hyperparameterMetricTag"] == "accuracy"
    assert [(t["trialId"], t["state"]) for t in output["trials"]] == [
        ("2", "SUCCEEDED"), ("1", "SUCCEEDED"), ("3", "FAILED"), ("4", "RUNNING")]
    best = output["trials"][0]
    assert best["finalMetric"] == {"trainingStep": "200", "objectiveValue": 0.83}
    assert best["hyperparameters"] == {"learning_rate": "0.1", "batch_size": "64"}
    assert best["allMetrics"] == [{"trainingStep": "100", "objectiveValue": 0.415}]
    assert best["startTime"] == "2026-11-23T10:00:00Z"


def test_cancel(api):
    api.route("POST", JOB_PATH + ":cancel", 200, {})
    assert engine(project=None).cancel(HANDLE) == jobs.CANCELLING
    (request,) = api.requests
    assert (request.method, request.path) == ("POST", JOB_PATH + ":cancel")


def entry(n: int, task: str, text: str, *, second: int | None = None, **extra) -> dict:
    stamp = f"2026-03-01T12:00:{second if second is not None else n:02d}.{n:06d}Z"
    return {"insertId": f"id{n:04d}", "timestamp": stamp, "severity": "INFO",
            "resource": {"type": "ml_job", "labels": {"job_id": HANDLE["id"],
                                                      "task_name": task,
                                                      "project_id": "mljob-test"}},
            "textPayload": text, **extra}


def test_logs_read_every_page_and_label_replicas(api):
    first = [entry(1, "workerpool0-0", "training started: strategy=ps"),
             entry(2, "workerpool1-1", "worker line one\nworker line two")]
    second = [entry(3, "workerpool2-0", "", textPayload=None,
                    jsonPayload={"message": "ps serving", "levelname": "INFO"}),
              entry(4, "workerpool3-0", "eval step=10 loss=0.5", severity="ERROR")]

    def pages(request):
        token = request.json().get("pageToken")
        return {"entries": first, "nextPageToken": "page-2"} if token is None \
            else {"entries": second}

    api.route("POST", LOGS_PATH, 200, pages)
    lines = list(engine(project=None).logs(HANDLE, follow=False))
    assert [line.split("\t")[2:] for line in lines] == [
        ["master-replica-0", "training started: strategy=ps"],
        ["worker-replica-1", "worker line one"], ["worker-replica-1", "worker line two"],
        ["ps-replica-0", "ps serving"], ["evaluator-replica-0", "eval step=10 loss=0.5"]]
    assert lines[0].split("\t")[:2] == ["INFO", "2026-03-01 12:00:01 +0000"]
    assert lines[-1].startswith("ERROR\t")
    bodies = [r.json() for r in api.requests]
    assert [r.path for r in api.requests] == [LOGS_PATH, LOGS_PATH]
    assert bodies[0] == {"resourceNames": ["projects/mljob-test"], "orderBy": "timestamp asc",
                         "pageSize": 1000, "filter": 'resource.type="ml_job" AND '
                         f'resource.labels.job_id="{HANDLE["id"]}"'}
    assert bodies[1]["pageToken"] == "page-2"


def test_logs_of_one_task(api):
    api.route("POST", LOGS_PATH, 200, {"entries": [entry(1, "workerpool1-1", "mine")]})
    lines = list(engine().logs(HANDLE, task_name="worker-replica-1", follow=False))
    assert [line.split("\t", 2)[2] for line in lines] == ["worker-replica-1\tmine"]
    assert api.requests[0].json()["filter"].endswith(
        ' AND resource.labels.task_name="workerpool1-1"')
    with pytest.raises(UsageError, match="--task-name 'master' names no replica"):
        list(engine().logs(HANDLE, task_name="master", follow=False))


def test_follow_reads_new_entries_once_until_the_job_ends(api):
    e1, e2, e3 = (entry(n, "workerpool0-0", f"line {n}", second=5) for n in (1, 2, 3))
    reads = [[e1, e2], [e2, e3], [e3]]   # the endpoint ignores the filter: repeats
    states = ["JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED"]
    api.route("POST", LOGS_PATH, 200, lambda r: {"entries": reads.pop(0)})
    api.route("GET", JOB_PATH, 200,
              lambda r: {"name": NAME, "state": states.pop(0) if len(states) > 1
                         else states[0]})
    vertex_engine = engine()
    vertex_engine.poll_s = 0.01
    lines = list(vertex_engine.logs(HANDLE, follow=True))
    assert [line.split("\t")[3] for line in lines] == ["line 1", "line 2", "line 3"]
    assert reads == []                   # stopped after a read with nothing new
    methods = [r.method for r in api.requests]
    assert methods == ["GET", "POST", "GET", "POST", "POST"]
    first, second = (api.requests[i].json()["filter"] for i in (1, 3))
    # while the job runs, the newest seconds wait for the next read (late arrivals)
    assert re.search(r' AND timestamp<"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z"$', first)
    # once it has ended, everything after the last entry seen, nothing before it
    assert second.endswith(' AND (timestamp>"2026-03-01T12:00:05.000002000Z" OR '
                           '(timestamp="2026-03-01T12:00:05.000002000Z" AND '
                           'insertId>"id0002"))')


def test_logging_refused_is_one_line(api):
    api.route("POST", LOGS_PATH, 403, {"error": {
        "code": 403, "status": "PERMISSION_DENIED",
        "message": "Permission 'logging.logEntries.list' denied on resource (or it may "
                   "not exist)."}})
    with pytest.raises(SubmitError) as info:
        list(engine().logs(HANDLE, follow=False))
    message = str(info.value)
    assert message.startswith("Cloud Logging refused to read the logs of job job01: 403 "
                              "Permission 'logging.logEntries.list' denied")
    assert "roles/logging.viewer" in message and "\n" not in message


# -- through the CLI ---------------------------------------------------------------------

def test_cli_submit_follow_describe_and_cancel(api, capsys, gcs_emulator, monkeypatch):
    """A whole life through `python -m submit`: the package is staged to (emulated) GCS
    at the URI the request names, the job is created, its logs followed to the end, and
    the job record drives `jobs describe` and `jobs cancel` afterwards."""
    from submit.__main__ import main
    from mljob import storage

    def cli(*argv):
        status = main(list(argv), standalone_mode=False)
        out, err = capsys.readouterr()
        return status, out, err

    job_dir = "gs://mljob-test/vertex/cli01"
    api.route("POST", f"/v1/{PARENT}/customJobs", 200,
              {"name": NAME, "displayName": "cli01", "state": "JOB_STATE_QUEUED"})
    api.route("GET", f"/v1/{NAME}", 200, {"name": NAME, "state": "JOB_STATE_SUCCEEDED"})
    api.route("POST", "/v2/entries:list", 200, {"entries": [
        entry(1, "workerpool0-0", "step 20/20 loss=0.4 accuracy=0.9"),
        entry(2, "workerpool0-0", "exported model to gs://mljob-test/vertex/cli01/model")]})
    monkeypatch.setattr(vertex.VertexEngine, "poll_s", 0.05)
    status, out, err = cli("cli01", "--runner", "vertex", "--project", "mljob-test",
                           "--scale-tier", "STANDARD_1", "--job-dir", job_dir, "--",
                           "--model", "mlp")
    assert status == 0, err
    assert "Job [cli01] submitted successfully to vertex." in out
    assert "master-replica-0\tstep 20/20 loss=0.4" in out
    assert out.rstrip().endswith("Job [cli01] SUCCEEDED.")
    sent = api.requests[0].json()
    pool = sent["jobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"]
    assert pool["args"] == ["trainer.task", "--model", "mlp", "--job-dir", job_dir]
    assert pool["packageUris"][0].startswith(job_dir + "/packages/")
    assert storage.exists(pool["packageUris"][0])   # staged before the job was created
    record = jobs.load("cli01")
    assert (record.runner, record.state, record.engine["name"]) == \
        ("vertex", jobs.SUCCEEDED, NAME)

    status, out, err = cli("jobs", "describe", "cli01")
    assert status == 0 and "state: SUCCEEDED" in out and "runner: vertex" in out
    status, out, err = cli("jobs", "cancel", "cli01")
    assert status == 2 and "already ended SUCCEEDED" in err

    record.set_state(jobs.RUNNING)   # as if it were still running: cancel asks first
    jobs.save(record)
    api.route("GET", f"/v1/{NAME}", 200, {"name": NAME, "state": "JOB_STATE_RUNNING"})
    api.route("POST", f"/v1/{NAME}:cancel", 200, {})
    status, out, err = cli("jobs", "cancel", "cli01")
    assert status == 0 and "Job [cli01] CANCELLING." in out
    assert api.requests[-1].path == f"/v1/{NAME}:cancel"
    api.route("GET", f"/v1/{NAME}", 200, {"name": NAME, "state": "JOB_STATE_CANCELLED"})
    status, out, err = cli("jobs", "describe", "cli01")
    assert "state: CANCELLED" in out and jobs.load("cli01").state == jobs.CANCELLED


@pytest.mark.parametrize("imports_mljob", [True, False])
def test_every_package_gets_mljobs_core_installed_for_the_launcher(capsys, tmp_path,
                                                                   imports_mljob):
    folder = tmp_path / "trainer"
    folder.mkdir()
    (folder / "task.py").write_text("from mljob import storage\n" if imports_mljob
                                    else "import json\n")
    status = main(["job01", "--runner", "vertex", "--project", "mljob-test", "--job-dir",
                   JOB_DIR, "--package-path", str(folder), "--module-name", "trainer.task",
                   "--dry-run"], standalone_mode=False)
    out, err = capsys.readouterr()
    assert status == 0, err
    uris = json.loads(out)["customJob"]["jobSpec"]["workerPoolSpecs"][0][
        "pythonPackageSpec"]["packageUris"]
    assert uris[0].startswith(f"{JOB_DIR}/packages/") and uris[0].endswith(
        "/trainer-0.0.0.tar.gz")
    # mljob's core alone (the full distribution has its own `trainer`), whether the code
    # imports mljob or not: the replica runs the module through mljob's launcher
    assert len(uris) == 2 and uris[1].endswith("/mljob-0.1.0.tar.gz")
    spec = json.loads(out)["customJob"]["jobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"]
    assert spec["pythonModule"] == "mljob.fitting.launch"
    assert spec["args"][0] == "trainer.task"


def test_jobs_update_changes_the_record_and_says_vertex_keeps_its_labels(api, capsys):
    """Vertex AI's JobService has no update for a created job: no request is sent, the
    record's labels change, and the user is told so on stderr."""
    record = jobs.JobRecord("upd01", runner="vertex", labels={"team": "vision"},
                            engine=dict(HANDLE))
    record.set_state(jobs.SUCCEEDED)
    jobs.save(record)
    from submit.__main__ import main
    status = main(["jobs", "update", "upd01", "--update-labels", "env=prod"],
                  standalone_mode=False)
    out, err = capsys.readouterr()
    assert status == 0 and out == "Updated job [upd01].\n"
    assert "Vertex AI cannot change a created job's labels" in err
    assert api.requests == []
    assert jobs.load("upd01").labels == {"team": "vision", "env": "prod"}
