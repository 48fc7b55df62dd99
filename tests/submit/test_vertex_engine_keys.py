"""Vertex AI's own keys in config.yaml (submit/jobdef/engine_keys.py): the scheduling strategy,
the VPC network, the service account, a Vertex TensorBoard, web access and the base
output directory, each rendered through aiplatform_v1's types and read back from the
request text by them; what Vertex AI refuses is refused first, in one line."""
from __future__ import annotations

import re

import pytest
from google.cloud import aiplatform_v1

from tests.support.specs import resolve as spec_of
from submit.errors import UsageError
from tests.submit.test_runner_vertex import (  # noqa: F401 - a fixture
    ENGINE_KEYS, PACKAGE, _no_ambient_cloud, engine, resolve)


def job_spec(training_input, **options) -> aiplatform_v1.CustomJobSpec:
    spec = resolve(training_input)
    vertex_engine = engine(**options)
    vertex_engine.check(spec)
    text = vertex_engine.render(spec, PACKAGE).text
    return aiplatform_v1.CreateCustomJobRequest.from_json(text).custom_job.job_spec


def test_each_key_reaches_the_custom_job_spec_as_its_type():
    got = job_spec(ENGINE_KEYS)
    assert got.service_account == ENGINE_KEYS["serviceAccount"]
    assert got.network == "projects/123456789/global/networks/ml-vpc"
    assert got.enable_web_access is True
    assert got.tensorboard == ENGINE_KEYS["tensorboard"]
    assert got.base_output_directory.output_uri_prefix == "gs://mljob-test/outputs/job01"
    assert got.scheduling.strategy == aiplatform_v1.Scheduling.Strategy.SPOT
    assert got.scheduling.timeout.total_seconds() == 7200
    flex = job_spec({"scheduling": {"strategy": "FLEX_START"}})
    assert flex.scheduling.strategy == aiplatform_v1.Scheduling.Strategy.FLEX_START
    plain = job_spec({})
    assert plain.base_output_directory.output_uri_prefix == "gs://mljob-test/job01"
    assert (plain.service_account, plain.network, plain.tensorboard) == ("", "", "")
    assert not plain.enable_web_access and "scheduling" not in plain
    # --service-account wins over the config's
    flag = job_spec(ENGINE_KEYS, service_account="other@mljob-test.iam.gserviceaccount.com")
    assert flag.service_account == "other@mljob-test.iam.gserviceaccount.com"


def test_every_strategy_we_take_is_one_of_vertexs():
    from submit.jobdef import engine_keys
    names = {s.name for s in aiplatform_v1.Scheduling.Strategy}
    assert set(engine_keys.STRATEGIES) <= names


@pytest.mark.parametrize("change,words", [
    ({"tensorboard": ENGINE_KEYS["tensorboard"]}, "trainingInput.tensorboard needs the "
     "service account"),
    ({**ENGINE_KEYS, "tensorboard": "projects/p/locations/europe-west4/tensorboards/1"},
     "is in europe-west4, the job in us-central1"),
    ({"scheduling": {"queueName": "q"}}, "trainingInput.scheduling.queueName is for "
     "--runner kubeflow"),
    ({"scheduling": {"ttlAfterFinished": "60s"}}, "ttlAfterFinished is for --runner kubeflow"),
    ({"serviceAccount": "trainer"}, "trainingInput.serviceAccount 'trainer' is not a "
     "service account email"),
])
def test_what_vertex_refuses_is_one_line_with_the_fix(change, words):
    with pytest.raises(UsageError, match=re.escape(words)) as info:
        job_spec(change)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("change,words", [
    ({"network": "ml-vpc"}, "write projects/PROJECT_NUMBER/global/networks/NAME"),
    ({"tensorboard": "4242"}, "write projects/PROJECT/locations/REGION/tensorboards/ID"),
    ({"baseOutputDirectory": "/tmp/out"}, "is not a gs:// URL"),
    ({"enableWebAccess": 1}, "trainingInput.enableWebAccess must be"),
    ({"scheduling": {"strategy": "spot"}}, "use one of STANDARD, SPOT, FLEX_START"),
])
def test_config_values_are_checked_when_read(change, words):
    with pytest.raises(UsageError, match=re.escape(words)):
        spec_of("job01", change, job_dir="gs://mljob-test/j",
                      staging_bucket="gs://mljob-staging")
