"""config.yaml's schema (submit/jobdef/config_schema.py): the published JSON Schema is current and
agrees with the pydantic models, proto-JSON's int64 strings are taken, and the resolved
JobSpec is what runners read (never the raw trainingInput)."""
from __future__ import annotations

import dataclasses
import json
import os

import jsonschema
import pytest
import yaml

from submit.jobdef import config_schema, spec as specs
from submit.errors import SubmitError
from tests.support.common import ROOT

SCHEMA_FILE = os.path.join(ROOT, config_schema.SCHEMA_PATH)


def test_the_published_schema_is_current(tmp_path):
    with open(SCHEMA_FILE, encoding="utf-8") as f:
        published = f.read()
    assert published == config_schema.schema_text(), \
        "docs/schema/config.schema.json is stale: run python -m submit.jobdef.config_schema"
    assert config_schema.main(["--check", SCHEMA_FILE]) == 0
    stale = tmp_path / "stale.json"
    stale.write_text(published.replace('"MAXIMIZE"', '"MAXIMISE"'))
    assert config_schema.main(["--check", str(stale)]) == 1
    schema = json.loads(published)
    jsonschema.Draft202012Validator.check_schema(schema)
    ti = schema["$defs"]["TrainingInput"]
    assert set(ti["properties"]) == set(specs.TRAINING_INPUT_KEYS)
    assert ti["additionalProperties"] is False
    # the repository's config.yaml names the schema for editors, and keeps to it
    with open(os.path.join(ROOT, "config.yaml"), encoding="utf-8") as f:
        text = f.read()
    assert text.startswith(f"# yaml-language-server: $schema={config_schema.SCHEMA_PATH}\n")
    jsonschema.validate(yaml.safe_load(text), schema)


# (config.yaml text, accepted?) -- each is read by the JSON Schema and by the models
AGREEMENT = [
    ("trainingInput: {}\n", True),
    ("trainingInput:\n  scaleTier: CUSTOM\n  masterType: n1-standard-4\n  workerCount: 2\n"
     "  parameterServerCount: '1'\n  workerConfig:\n    acceleratorConfig: "
     "{count: '1', type: NVIDIA_TESLA_T4}\n    restartPolicy: OnFailure\n"
     "    maxRestarts: '3'\n", True),
    ("x-base: &b [--steps, '3']\ntrainingInput:\n  args: *b\nlabels: {team: vision}\n"
     "jobId: job01\n", True),
    ("trainingInput:\n  scheduling: {maxRunningTime: 7200s, maxWaitTime: 1.5s}\n", True),
    ("trainingInput:\n  hyperparameters:\n    goal: MAXIMIZE\n    maxTrials: '8'\n"
     "    maxParallelTrials: 2\n    params:\n    - {parameterName: lr, type: DOUBLE, "
     "minValue: 0.001, maxValue: 0.1, scaleType: UNIT_LOG_SCALE}\n"
     "    - {parameterName: model, type: CATEGORICAL, categoricalValues: [a, b]}\n", True),
    ("trainingInput:\n  workerCount:\n  useChiefInTfConfig: false\n", True),  # null: unset
    ("trainingInputs: {}\n", False),
    ("trainingInput:\n  workerCounts: 2\n", False),
    ("trainingInput:\n  worker_count: 2\n", False),
    ("trainingInput:\n  workerCount: two\n", False),
    ("trainingInput:\n  workerCount: '2.0'\n", False),
    ("trainingInput:\n  workerCount: true\n", False),
    ("trainingInput:\n  workerCount: 2.5\n", False),
    ("trainingInput:\n  args: [1, 2]\n", False),
    ("trainingInput:\n  workerConfig: {restartPolicy: Sometimes}\n", False),
    ("trainingInput:\n  masterConfig: {maxRestarts: 101}\n", False),
    ("trainingInput:\n  masterConfig: {acceleratorConfig: {count: -1}}\n", False),
    ("trainingInput:\n  masterConfig: {acceleratorConfig: {count: '-1'}}\n", False),
    ("trainingInput:\n  masterConfig: {acceleratorConfig: {cores: 2}}\n", False),
    ("trainingInput:\n  masterConfig: {acceleratorConfig: 4}\n", False),
    ("trainingInput:\n  scheduling: {maxRunningTime: 2h}\n", False),
    ("trainingInput:\n  scheduling: {deadline: 30s}\n", False),
    ("trainingInput:\n  hyperparameters: [1, 2]\n", False),
    ("trainingInput:\n  hyperparameters: {goal: maximize, params: [{parameterName: a, "
     "type: DOUBLE}]}\n", False),
    ("trainingInput:\n  hyperparameters: {goal: MAXIMIZE, params: []}\n", False),
    ("trainingInput:\n  hyperparameters: {goal: MAXIMIZE, maxTrials: '0', params: "
     "[{parameterName: a, type: DOUBLE}]}\n", False),
    ("trainingInput:\n  hyperparameters: {goal: MAXIMIZE, params: [lr]}\n", False),
    ("trainingInput:\n  hyperparameters: {goal: MAXIMIZE, params: [{parameterName: a, "
     "type: FLOAT}]}\n", False),
    ("trainingInput:\n  hyperparameters: {goal: MAXIMIZE, params: [{parameterName: a, "
     "type: DISCRETE, discreteValues: ['32']}]}\n", False),
    ("trainingInput:\n  useChiefInTfConfig: 'yes'\n", False),
    ("trainingInput:\n  masterConfig: {containerCommand: python}\n", False),
    ("trainingInput:\n  masterConfig: {imageUri: gcr.io/my-project/trainer:1}\n", True),
    ("trainingInput:\n  masterConfig: {imageUri: 'My Image'}\n", False),
    ("labels: [a, b]\n", False),
    ("labels: {team: 5.5}\n", False),
]


@pytest.mark.parametrize("text,accepted", AGREEMENT)
def test_the_json_schema_and_the_models_agree(tmp_path, text, accepted):
    validator = jsonschema.Draft202012Validator(json.loads(config_schema.schema_text()))
    path = tmp_path / "config.yaml"
    path.write_text(text)
    try:
        specs.config_labels(specs.read_config(str(path)))
        models = True
    except SubmitError as exc:
        assert "\n" not in str(exc)
        models = False
    assert validator.is_valid(yaml.safe_load(text)) == models == accepted


def test_int64_fields_are_taken_as_strings_of_digits(tmp_path):
    """As gcloud takes them from `describe --format yaml` (the REST API writes int64 as a
    JSON string): counts, GPUs, restarts and the tuning job's trial counts."""
    path = tmp_path / "config.yaml"
    path.write_text(
        "trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
        "  workerCount: '3'\n  parameterServerCount: ' 2 '\n  evaluatorCount: '1'\n"
        "  masterConfig:\n    acceleratorConfig: {count: '2', type: NVIDIA_TESLA_T4}\n"
        "    maxRestarts: '4'\n    restartPolicy: OnFailure\n"
        "  hyperparameters:\n    goal: MINIMIZE\n    maxTrials: '12'\n"
        "    maxParallelTrials: '3'\n    maxFailedTrials: '0'\n"
        "    params: [{parameterName: units, type: INTEGER, minValue: 1, maxValue: 9}]\n")
    spec = specs.resolve(specs.Flags("job01", job_dir=str(tmp_path / "job")),
                         specs.read_config(str(path)))
    assert {g.task_type: g.count for g in spec.groups} == {"chief": 1, "worker": 3,
                                                          "ps": 2, "evaluator": 1}
    chief = spec.group("chief")
    assert chief is not None
    assert (chief.gpus, chief.accelerator_count, chief.accelerator_type,
            chief.max_restarts) == (2, 2, "NVIDIA_TESLA_T4", 4)
    assert spec.tuning is not None
    assert (spec.tuning.max_trials, spec.tuning.max_parallel_trials,
            spec.tuning.max_failed_trials) == (12, 3, 0)
    # replicas see numbers in TF_CONFIG's `job`, as Cloud ML sent them
    assert spec.training_input["workerCount"] == 3
    assert spec.training_input["hyperparameters"]["maxTrials"] == 12


@pytest.mark.parametrize("value,words", [
    ("'2.0'", "trainingInput.workerCount must be an integer, not a string '2.0'"),
    ("'1e3'", "must be an integer, not a string '1e3'"),
    ("'9223372036854775808'", "'9223372036854775808' is out of int64's range"),
    ("'-2'", "trainingInput.workerCount -2 is negative"),
])
def test_int64_strings_that_are_no_int64_are_one_line(tmp_path, value, words):
    path = tmp_path / "config.yaml"
    path.write_text(f"trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
                    f"  workerCount: {value}\n")
    with pytest.raises(SubmitError) as exc:
        specs.resolve(specs.Flags("job01", job_dir=str(tmp_path / "job")),
                      specs.read_config(str(path)))
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_snake_case_keys_are_refused_naming_the_json_name():
    with pytest.raises(SubmitError) as exc:
        specs.training_config({"master_type": "standard"})
    assert str(exc.value).startswith(
        "trainingInput has unknown key 'master_type' (Cloud ML's JSON name is "
        "masterType); allowed keys are scaleTier, masterType")
    with pytest.raises(SubmitError) as exc:
        specs.training_config({"hyperparameters": {
            "goal": "MAXIMIZE", "max_trials": 2, "params": [{"parameterName": "a",
                                                            "type": "DOUBLE"}]}})
    assert "hyperparameters has unknown key 'max_trials' (Cloud ML's JSON name is " \
           "maxTrials)" in str(exc.value)


def test_runners_read_the_resolved_spec_not_the_raw_training_input():
    """The renderers render the same job from a JobSpec whose trainingInput is emptied:
    machines, GPUs, accelerators, region and the tuning spec are the spec's fields."""
    pytest.importorskip("google.cloud.aiplatform_v1")
    pytest.importorskip("kubernetes")
    from submit.runners.engine import EngineOptions
    from submit.runners.kubeflow import KubeflowEngine
    from submit.runners.vertex import VertexEngine
    from tests.submit.test_runner_vertex import PACKAGE

    hp = {"goal": "MAXIMIZE", "maxTrials": "4", "maxParallelTrials": 2,
          "params": [{"parameterName": "lr", "type": "DOUBLE", "minValue": 0.01,
                      "maxValue": 0.1}]}
    for ti in ({"scaleTier": "CUSTOM", "masterType": "n1-standard-8", "workerCount": 2,
                "workerType": "n1-standard-4", "region": "europe-west4",
                "masterConfig": {"acceleratorConfig": {"count": 2,
                                                       "type": "NVIDIA_TESLA_T4"}},
                "workerConfig": {"acceleratorConfig": {"count": "1",
                                                       "type": "NVIDIA_L4"}}},
               {"scaleTier": "BASIC_GPU", "hyperparameters": hp},
               {"scaleTier": "STANDARD_1", "region": "us-central1",
                "serviceAccount": "trainer@my-project.iam.gserviceaccount.com",
                "network": "projects/123/global/networks/vpc-1", "enableWebAccess": True,
                "tensorboard": "projects/123/locations/us-central1/tensorboards/77",
                "baseOutputDirectory": "gs://mljob-test/out",
                "scheduling": {"strategy": "SPOT", "queueName": "team-a",
                               "ttlAfterFinished": "3600s"}}):
        spec = specs.resolve(specs.Flags("job01", job_dir="gs://mljob-test/jobs/job01"),
                             specs.training_config(ti))
        bare = dataclasses.replace(spec, training_input={})
        for engine in (VertexEngine(EngineOptions(project="my-project")),
                       KubeflowEngine(EngineOptions(image="img", namespace="ml"))):
            full, empty = engine.render(spec, PACKAGE), engine.render(bare, PACKAGE)
            assert full.text == empty.text, type(engine).__name__
        if "region" in ti:
            assert VertexEngine(EngineOptions(project="my-project")).render(
                bare, PACKAGE).handle["region"] == ti["region"]
