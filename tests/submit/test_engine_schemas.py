"""Every Kubernetes manifest `--runner kubeflow` renders, checked against the engine's own
published schema at a named release (tests/schemas/README.md): the TFJob against the
training-operator's CRD, the JobSet against JobSet's, the Katib Experiment against Katib's
OpenAPI (its trial TFJob against the TFJob CRD), the JobSet's Jobs against the batch/v1
JobTemplateSpec. Then wrong fields planted in each, which the schema must refuse: the
check is only worth what it can catch."""
from __future__ import annotations

import copy
import json
import os

import pytest
import yaml

from tests.support import crd_schema
from tests.support.common import ROOT
from tests.support.specs import resolve as spec_of
from submit.packaging.package import Package

kubeflow = pytest.importorskip("submit.runners.kubeflow")
from submit.runners.engine import EngineOptions  # noqa: E402

SHA = "0" * 64
PACKAGE = Package(file_name="mljob-0.1.0.tar.gz", sha256=SHA, top_dir="mljob-0.1.0",
                  url=f"gs://mljob-staging/job01/{SHA}/mljob-0.1.0.tar.gz")
CUSTOM = {
    "scaleTier": "CUSTOM", "masterType": "standard_gpu",
    "masterConfig": {"acceleratorConfig": {"count": 1, "type": "NVIDIA_TESLA_T4"}},
    "workerType": "large_model", "workerCount": 2,
    "workerConfig": {"restartPolicy": "ExitCode", "maxRestarts": 3},
    "parameterServerType": "n1-highmem-2", "parameterServerCount": 1,
    "parameterServerConfig": {"restartPolicy": "OnFailure", "maxRestarts": 5},
    "evaluatorType": "complex_model_s", "evaluatorCount": 1,
    "evaluatorConfig": {"restartPolicy": "Always"},
    "useChiefInTfConfig": False, "serviceAccount": "trainer",
    "scheduling": {"maxRunningTime": "7200s", "strategy": "SPOT",
                   "queueName": "team-a-queue", "ttlAfterFinished": "86400s"},
    "args": ["--model", "cnn", "--train-steps", "5000"]}
CASES = {"standard_1": ({}, "STANDARD_1"), "custom": (CUSTOM, None),
         "basic": ({}, "BASIC"),
         "containers": ({"scaleTier": "CUSTOM", "masterType": "standard", "workerCount": 1,
                         "masterConfig": {"imageUri": "registry.example/own:1",
                                          "containerCommand": ["python", "/app/train.py"]},
                         "workerConfig": {"imageUri": "registry.example/own:1"}}, None)}


def render(case: str, api: str, **options) -> dict:
    training_input, tier = CASES[case]
    spec = spec_of("job01", training_input, scale_tier=tier,
                         job_dir="gs://mljob-test/jobs/job01",
                         staging_bucket="gs://mljob-staging")
    engine = kubeflow.KubeflowEngine(EngineOptions(
        namespace="team-a", api=api, image=None if case == "containers" else "img:1",
        **options))
    engine.check(spec)
    rendered = engine.render(spec, None if case == "containers" else PACKAGE)
    assert yaml.safe_load(rendered.text) == rendered.body
    return copy.deepcopy(dict(rendered.body))


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_tfjob_meets_the_training_operators_crd(case):
    assert crd_schema.tfjob_errors(render(case, "tfjob")) == []


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_jobset_meets_jobsets_crd_and_its_jobs_the_job_schema(case):
    body = render(case, "jobset")
    assert crd_schema.jobset_errors(body) == []
    for rjob in body["spec"]["replicatedJobs"]:
        job = {"apiVersion": "batch/v1", "kind": "Job", **rjob["template"]}
        assert crd_schema.job_errors(job) == []
        assert _kubernetes_model(job, "V1Job") == job  # and the kubernetes client's model


def _kubernetes_model(body: dict, kind: str) -> dict:
    """Deserialise into the kubernetes client's model and back: what it drops differs."""
    from kubernetes.client import ApiClient
    client = ApiClient()

    class Response:
        data = json.dumps(body)
    return client.sanitize_for_serialization(client.deserialize(Response(), kind))


def test_the_goldens_meet_their_schemas():
    for name, check in (("tfjob_standard_1", crd_schema.tfjob_errors),
                        ("tfjob_custom_evaluator", crd_schema.tfjob_errors),
                        ("jobset_standard_1", crd_schema.jobset_errors),
                        ("jobset_custom_evaluator", crd_schema.jobset_errors),
                        ("katib_experiment", crd_schema.experiment_errors)):
        with open(os.path.join(ROOT, "tests", "golden", name + ".yaml")) as f:
            assert check(yaml.safe_load(f)) == [], name


def test_the_katib_experiment_meets_katibs_openapi_and_its_trial_the_tfjob_crd():
    hp = {"goal": "MAXIMIZE", "hyperparameterMetricTag": "accuracy", "maxTrials": 4,
          "maxParallelTrials": 2, "enableTrialEarlyStopping": True,
          "params": [{"parameterName": "lr", "type": "DOUBLE", "minValue": 0.001,
                      "maxValue": 0.1, "scaleType": "UNIT_LOG_SCALE"},
                     {"parameterName": "units", "type": "DISCRETE",
                      "discreteValues": [32, 64]}]}
    spec = spec_of("tune01", {**CUSTOM, "hyperparameters": hp},
                         job_dir="gs://mljob-test/jobs/tune01",
                         staging_bucket="gs://mljob-staging")
    body = kubeflow.KubeflowEngine(EngineOptions(namespace="team-a", image="i:1")).render(
        spec, PACKAGE).body
    assert body["kind"] == "Experiment"
    assert crd_schema.experiment_errors(body) == []


def _set(body, path, value):
    *parents, last = path
    for key in parents:
        body = body[key]
    if value is _DELETE:
        del body[last]
    else:
        body[last] = value


_DELETE = object()
POD = ["spec", "replicatedJobs", 0, "template", "spec", "template", "spec"]
TF_POD = ["spec", "tfReplicaSpecs", "Chief", "template", "spec"]


@pytest.mark.parametrize("api,path,value,words", [
    # a misspelt field: pruned by the API server, so refused here
    ("jobset", ["spec", "sucessPolicy"], {"operator": "All"}, "'sucessPolicy' was unexpected"),
    ("jobset", [*POD, "restartpolicy"], "Never", "'restartpolicy' was unexpected"),
    # a value outside the enum, a wrong type, out of int32, a required field missing
    ("jobset", ["spec", "successPolicy", "operator"], "Chief", "is not one of ['All', 'Any']"),
    ("jobset", ["spec", "failurePolicy", "rules", 0, "action"], "Restart", "is not one of"),
    ("jobset", ["spec", "replicatedJobs", 0, "replicas"], "1", "'1' is not of type 'integer'"),
    ("jobset", ["spec", "replicatedJobs", 0, "replicas"], 2**31, "greater than the maximum"),
    ("jobset", ["spec", "replicatedJobs", 0, "name"], _DELETE, "'name' is a required"),
    ("jobset", [*POD, "containers", 0, "resources", "requests", "cpu"], [4], "is not valid"),
    # a list-map with two entries of one key (the container's env by name)
    ("jobset", [*POD, "containers", 0, "env", 1, "name"], "MLJOB_REPLICA_INDEX",
     "duplicate entry for {'name': 'MLJOB_REPLICA_INDEX'}"),
    # (the TFJob CRD has no enums: a wrong cleanPodPolicy name is the operator's to refuse)
    ("tfjob", ["spec", "runPolicy", "cleanPodPolicy"], 3, "3 is not of type 'string'"),
    ("tfjob", ["spec", "runPolicy", "suspended"], True, "'suspended' was unexpected"),
    ("tfjob", [*TF_POD, "containers", 0, "ports", 0, "containerPort"], "2222",
     "is not of type 'integer'"),
    ("tfjob", ["spec", "tfReplicaSpecs", "Chief", "replicas"], 2**31, "greater than the"),
    ("tfjob", ["spec", "tfReplicaSpec"], {}, "'tfReplicaSpec' was unexpected"),
])
def test_a_planted_fault_is_refused_by_the_schema(api, path, value, words):
    body = render("standard_1", api)
    _set(body, path, value)
    found = crd_schema.jobset_errors(body) if api == "jobset" else \
        crd_schema.tfjob_errors(body)
    assert found and any(words in e for e in found), found


def test_a_planted_fault_in_the_experiment_and_the_job_is_refused():
    hp = {"goal": "MINIMIZE", "hyperparameterMetricTag": "loss", "maxTrials": 2,
          "params": [{"parameterName": "lr", "type": "DOUBLE", "minValue": 0.001,
                      "maxValue": 0.1}]}
    spec = spec_of("tune01", {"hyperparameters": hp},
                         job_dir="gs://mljob-test/jobs/tune01",
                         staging_bucket="gs://mljob-staging")
    body = kubeflow.KubeflowEngine(EngineOptions(namespace="team-a", image="i:1")).render(
        spec, PACKAGE).body
    wrong = copy.deepcopy(body)
    wrong["spec"]["objective"]["objectiveMetricNames"] = ["loss"]
    wrong["spec"]["maxTrialCount"] = "2"
    wrong["spec"]["trialTemplate"]["trialSpec"]["spec"]["runPolicy"]["backoff"] = 1
    found = crd_schema.experiment_errors(wrong)
    assert any("'objectiveMetricNames' was unexpected" in e for e in found), found
    assert any("maxTrialCount: '2' is not of type 'integer'" in e for e in found), found
    assert any(e.startswith("spec.trialTemplate.trialSpec.spec.runPolicy") and
               "'backoff' was unexpected" in e for e in found), found
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
           "spec": {"completionMod": "Indexed", "completions": "3", "template": {"spec": {
               "containers": [{"name": "c", "image": "i"}], "restartPolicy": "Never"}}}}
    found = crd_schema.job_errors(job)
    assert any("'completionMod' was unexpected" in e for e in found), found
    assert "spec.completions: '3' is not of type 'integer'" in found, found
