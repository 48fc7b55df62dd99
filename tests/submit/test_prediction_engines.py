"""Batch prediction on the engines: Vertex AI's BatchPredictionJob through aiplatform_v1's
own types and its REST client (to a recording endpoint), and a Kubernetes Indexed Job
checked against the kubernetes client's V1Job and V1ConfigMap models and against the
JobTemplateSpec schema in JobSet's CRD (tests/schemas/README.md)."""
import json

import pytest
import yaml
from google.cloud import aiplatform_v1
from kubernetes.client import ApiClient

from mljob import storage
from submit import jobs
from submit.runners import vertex
from tests.support import crd_schema
from tests.support.api_edge import ApiEdge
from tests.support.submit_cli import one_error_line, run

PARENT = "projects/mljob-test/locations/europe-west4"
NAME = f"{PARENT}/batchPredictionJobs/4242"


@pytest.fixture(autouse=True)
def _no_ambient_cloud(monkeypatch):
    for name in (*vertex.PROJECT_ENVS, vertex.VERTEX_ENDPOINT_ENV):
        monkeypatch.delenv(name, raising=False)


def argv(runner, *extra, **change):
    flags = {"--model-dir": "gs://mljob-test/job/model",
             "--input-paths": "gs://mljob-test/in/*.json",
             "--output-path": "gs://mljob-test/out", "--data-format": "tf-record-gzip",
             "--region": "europe-west4", "--max-worker-count": "6", "--batch-size": "32",
             "--labels": "team=vision"}
    flags.update(change)
    out = ["jobs", "submit", "prediction", "job_01", "--runner", runner, *extra]
    for flag, value in flags.items():
        if value is not None:
            out += [flag, value]
    return out


def test_vertex_request_parses_back_through_aiplatform_types(capsys):
    status, out, err = run(capsys, *argv("vertex", "--project", "mljob-test", "--dry-run"))
    assert status == 0, err
    request = aiplatform_v1.CreateBatchPredictionJobRequest.from_json(out)  # strict
    assert request.parent == PARENT
    job = request.batch_prediction_job
    assert job.display_name == "job_01"
    assert job.input_config.instances_format == "tf-record-gzip"
    assert list(job.input_config.gcs_source.uris) == ["gs://mljob-test/in/*.json"]
    assert job.output_config.predictions_format == "jsonl"
    assert job.output_config.gcs_destination.output_uri_prefix == "gs://mljob-test/out"
    assert job.dedicated_resources.max_replica_count == 6
    assert job.dedicated_resources.starting_replica_count == 1
    assert job.dedicated_resources.machine_spec.machine_type == "n1-standard-4"
    assert job.manual_batch_tuning_parameters.batch_size == 32
    assert job.unmanaged_container_model.artifact_uri == "gs://mljob-test/job/model"
    assert job.unmanaged_container_model.container_spec.image_uri.startswith(
        "europe-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.")
    # the prebuilt image's TensorFlow is older than this one's: said, on stderr
    assert "Vertex's prebuilt image serves with TensorFlow 2.15" in err
    assert "export made with TensorFlow 2.21" in err and "--image" in err
    assert dict(job.labels) == {"team": "vision", "mljob-job-id": "job_01"}
    assert not job.model
    body = json.loads(out)["batchPredictionJob"]
    assert body["inputConfig"]["instancesFormat"] == "tf-record-gzip"  # the REST spelling
    broken = out.replace('"batchSize"', '"batchSizes"')
    with pytest.raises(Exception, match="batchSizes"):
        aiplatform_v1.CreateBatchPredictionJobRequest.from_json(broken)


def test_vertex_model_resource_and_version(capsys):
    status, out, err = run(capsys, *argv("vertex", "--project", "mljob-test", "--dry-run",
                                         **{"--model-dir": None, "--model": "mnist",
                                            "--version": "v2", "--data-format": "text"}))
    assert status == 0, err
    job = aiplatform_v1.CreateBatchPredictionJobRequest.from_json(out).batch_prediction_job
    assert job.model == f"{PARENT}/models/mnist@v2"
    assert job.input_config.instances_format == "jsonl"
    assert not job.unmanaged_container_model.artifact_uri


@pytest.mark.parametrize("extra,change,words", [
    ([], {}, "needs a Google Cloud project"),
    (["--project", "Bad_Project"], {}, "is not a Google Cloud project id"),
    (["--project", "mljob-test"], {"--output-path": "/tmp/out"},
     "--output-path /tmp/out cannot be read by the engine's workers"),
    (["--project", "mljob-test"], {"--input-paths": "/data/*.json"}, "cannot be read"),
    (["--project", "mljob-test"], {"--signature-name": "classify"},
     "serves a TensorFlow model's serving_default signature only"),
])
def test_vertex_refusals_are_one_line(capsys, extra, change, words):
    status, _, err = run(capsys, *argv("vertex", *extra, "--dry-run", **change))
    assert status == 2 and words in one_error_line(err)


def test_vertex_create_describe_and_cancel_over_rest(capsys, monkeypatch):
    with ApiEdge() as api:
        monkeypatch.setenv(vertex.VERTEX_ENDPOINT_ENV, api.url)
        api.route("POST", f"/v1/{PARENT}/batchPredictionJobs", 200,
                  {"name": NAME, "displayName": "job_01", "state": "JOB_STATE_QUEUED"})
        status, out, err = run(capsys, *argv("vertex", "--project", "mljob-test"))
        assert status == 0, err
        assert f"submitted successfully to vertex ({NAME})" in out
        (request,) = api.requests
        sent = aiplatform_v1.BatchPredictionJob.from_json(request.body)
        assert sent.dedicated_resources.max_replica_count == 6
        record = jobs.load("job_01")
        assert record.runner == "vertex" and record.engine["kind"] == "batchPredictionJob"
        assert record.prediction_input["dataFormat"] == "TF_RECORD_GZIP"
        api.route("GET", f"/v1/{NAME}", 200, {
            "name": NAME, "state": "JOB_STATE_SUCCEEDED",
            "outputInfo": {"gcsOutputDirectory": "gs://mljob-test/out/prediction-job_01"},
            "completionStats": {"successfulCount": "998", "failedCount": "2"},
            "resourcesConsumed": {"replicaHours": 0.25}})
        status, out, err = run(capsys, "jobs", "describe", "job_01")
        assert status == 0, err
        described = yaml.safe_load(out.split("\n\nView")[0])
        assert described["state"] == "SUCCEEDED"
        assert described["predictionOutput"] == {
            "outputPath": "gs://mljob-test/out/prediction-job_01",
            "predictionCount": "998", "errorCount": "2", "nodeHours": 0.25}
        assert api.requests[-1].path == f"/v1/{NAME}"


def test_an_engine_job_takes_no_id_the_index_holds(capsys, monkeypatch):
    """A batch prediction job on an engine is refused an id the local index already
    holds (another job's record is never written over), before any API call."""
    with ApiEdge() as api:
        monkeypatch.setenv(vertex.VERTEX_ENDPOINT_ENV, api.url)
        jobs.save(jobs.JobRecord("job_01", state=jobs.SUCCEEDED, job_dir="/tmp/j"))
        for extra in ([], ["--resume"]):
            status, _, err = run(capsys, *argv("vertex", "--project", "mljob-test", *extra))
            assert status == 2 and one_error_line(err) == (
                "error: job id 'job_01' already exists (SUCCEEDED, runner local); pick "
                "another job id")
        assert api.requests == [] and jobs.load("job_01").job_dir == "/tmp/j"


def test_vertex_cancel_posts_cancel(capsys, monkeypatch):
    with ApiEdge() as api:
        monkeypatch.setenv(vertex.VERTEX_ENDPOINT_ENV, api.url)
        jobs.save(jobs.JobRecord("job_01", runner="vertex", mode="prediction", engine={
            "project": "mljob-test", "region": "europe-west4", "parent": PARENT,
            "display_name": "job_01", "kind": "batchPredictionJob", "name": NAME}))
        api.route("GET", f"/v1/{NAME}", 200, {"name": NAME, "state": "JOB_STATE_RUNNING"})
        api.route("POST", f"/v1/{NAME}:cancel", 200, {})
        status, out, err = run(capsys, "jobs", "cancel", "job_01")
        assert status == 0, err
        assert [(r.method, r.path) for r in api.requests][-1] == ("POST", f"/v1/{NAME}:cancel")
        assert jobs.load("job_01").state == jobs.CANCELLING


def _sdk(body: dict, kind: str) -> dict:
    client = ApiClient()

    class Response:
        data = json.dumps(body)
    return client.sanitize_for_serialization(client.deserialize(Response(), kind))


@pytest.fixture
def gs_inputs(gcs_emulator):
    base = "gs://mljob-test/batch-k8s"
    for i in range(3):
        storage.write_bytes(f"{base}/in/{i}.json", b'{"image": [0.5], "key": 1}\n' * 10)
    storage.write_bytes(f"{base}/model/saved_model.pb", b"")
    return base


def test_kubeflow_indexed_job_and_plan_match_the_kubernetes_models(capsys, gs_inputs):
    status, out, err = run(capsys, *argv(
        "kubeflow", "--image", "registry.example/mljob:1", "--namespace", "team-a",
        "--dry-run", **{"--model-dir": f"{gs_inputs}/model",
                        "--input-paths": f"{gs_inputs}/in/*.json",
                        "--output-path": f"{gs_inputs}/out", "--data-format": "text",
                        "--max-worker-count": "2"}))
    assert status == 0, err
    config_map, job = yaml.safe_load_all(out)
    assert _sdk(config_map, "V1ConfigMap") == config_map  # nothing the models drop
    assert _sdk(job, "V1Job") == job
    assert crd_schema.job_errors(job) == []  # and Kubernetes' own schema (JobSet's CRD)
    plan = json.loads(config_map["data"]["prediction.json"])
    assert [s["url"] for s in plan["shards"]] == [f"{gs_inputs}/in/{i}.json"
                                                  for i in range(3)]
    assert plan["output_path"] == f"{gs_inputs}/out"
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == (
        "Indexed", 3, 2)
    assert (spec["backoffLimitPerIndex"], spec["maxFailedIndexes"]) == (2, 0)
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["command"][:3] == ["python", "-m", "predict.batch_worker"]
    assert pod["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]
    assert job["metadata"]["namespace"] == "team-a"
    assert job["metadata"]["name"] == "job-01"


@pytest.mark.parametrize("extra,change,words", [
    ([], {}, "--runner kubeflow needs --image"),
    (["--image", "r/i:1"], {"--model-dir": None, "--model": "m"},
     "--runner kubeflow takes --model-dir gs://"),
    (["--image", "r/i:1", "--namespace", "Team_A"], {}, "is not a Kubernetes namespace"),
    (["--image", "r/i:1"], {"--input-paths": "/data/*.json"}, "cannot be read"),
])
def test_kubeflow_refusals_are_one_line(capsys, extra, change, words):
    status, _, err = run(capsys, *argv("kubeflow", *extra, "--dry-run", **change))
    assert status == 2 and words in one_error_line(err)


def test_kubeflow_create_posts_the_plan_then_the_job(capsys, gs_inputs, tmp_path,
                                                     monkeypatch):
    with ApiEdge() as api:
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "edge",
                  "clusters": [{"name": "edge", "cluster": {"server": api.url}}],
                  "users": [{"name": "me", "user": {"token": "t0ken"}}],
                  "contexts": [{"name": "edge", "context": {"cluster": "edge",
                                                            "user": "me"}}]}
        (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
        monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
        api.route("POST", "/api/v1/namespaces/team-a/configmaps", 201,
                  lambda req: req.json())
        api.route("POST", "/apis/batch/v1/namespaces/team-a/jobs", 201,
                  lambda req: req.json())
        status, out, err = run(capsys, *argv(
            "kubeflow", "--image", "registry.example/mljob:1", "--namespace", "team-a",
            **{"--model-dir": f"{gs_inputs}/model", "--input-paths": f"{gs_inputs}/in/*",
               "--output-path": f"{gs_inputs}/out2", "--data-format": "text"}))
        assert status == 0, err
        assert [r.path for r in api.requests] == ["/api/v1/namespaces/team-a/configmaps",
                                                  "/apis/batch/v1/namespaces/team-a/jobs"]
        assert api.requests[1].headers["authorization"] == "Bearer t0ken"
        assert api.requests[1].json()["spec"]["completions"] == 3
        # kept in the local index, as every job: followed, described, cancelled by id
        assert out == "Job [job_01] submitted successfully to kubeflow (namespace team-a).\n"
        assert "python -m submit jobs stream-logs job_01" in err
        record = jobs.load("job_01")
        assert (record.runner, record.mode) == ("kubeflow", "prediction")
        assert record.engine["kind"] == "Job" and record.engine["name"] == "job-01"
        assert record.prediction_input["inputPaths"] == [f"{gs_inputs}/in/*"]
