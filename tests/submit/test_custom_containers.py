"""Custom containers as Cloud ML takes them (`--master-image-uri`, `--worker-image-uri`,
`--parameter-server-image-uri`, `imageUri`, `containerCommand`, `containerArgs`):
rendered for Kubeflow (the pod's image and command, no image build) and Vertex
(`containerSpec`, built through the SDK's own types); the local runner's containers are
tests/submit/test_local_containers.py's."""
from __future__ import annotations

import json

import pytest
import yaml

from submit import jobs as records
from tests.support.submit_cli import nothing_written, one_error_line, run

CONFIG = ("trainingInput:\n  scaleTier: CUSTOM\n  masterType: n1-standard-4\n"
          "  workerCount: '2'\n  parameterServerCount: '1'\n"
          "  masterConfig:\n    imageUri: gcr.io/my-proj/trainer:1\n"
          "    containerCommand: [python, -m, trainer.task]\n"
          "  workerConfig:\n    imageUri: gcr.io/my-proj/worker@sha256:" + "a" * 64 + "\n"
          "  parameterServerConfig:\n    containerArgs: [--role, ps]\n")


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    return str(path)


def dry(capsys, *argv) -> str:
    status, out, err = run(capsys, "jobs", "submit", "training", "job01", *argv,
                           "--dry-run", "--", "--epochs", "2")
    assert status == 0, err
    return out


def test_kubeflow_pods_run_the_images_as_given(capsys, config, tmp_path):
    out = dry(capsys, "--runner", "kubeflow", "--job-dir", "gs://mljob-test/cc/job01",
              "--config", config)
    header, body = out.split("apiVersion:", 1)
    assert "Dockerfile" not in header and "docker build" not in out   # no image build
    tfjob = yaml.safe_load("apiVersion:" + body)
    specs = tfjob["spec"]["tfReplicaSpecs"]
    chief, = specs["Chief"]["template"]["spec"]["containers"]
    worker, = specs["Worker"]["template"]["spec"]["containers"]
    ps, = specs["PS"]["template"]["spec"]["containers"]
    assert chief["image"] == "gcr.io/my-proj/trainer:1"
    assert chief["command"] == ["python", "-m", "trainer.task"]
    assert chief["args"] == ["--epochs", "2", "--job-dir", "gs://mljob-test/cc/job01"]
    assert worker["image"] == "gcr.io/my-proj/worker@sha256:" + "a" * 64
    assert "command" not in worker          # the image's own entrypoint
    assert ps["image"] == "gcr.io/my-proj/trainer:1"   # the master's, as Cloud ML
    assert ps["args"] == ["--role", "ps"]   # containerArgs replace the trainer args
    assert specs["Worker"]["replicas"] == 2
    assert "mljob/package-uri" not in tfjob["metadata"].get("annotations", {})
    assert not (tmp_path / "cc").exists()


def test_vertex_gets_container_specs(capsys, config, monkeypatch):
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    out = dry(capsys, "--runner", "vertex", "--project", "my-proj-1", "--job-dir",
              "gs://mljob-test/cc/job01", "--config", config)
    pools = json.loads(out)["customJob"]["jobSpec"]["workerPoolSpecs"]
    assert all("pythonPackageSpec" not in p for p in pools)
    chief, worker, ps = (p["containerSpec"] for p in pools)
    assert chief["imageUri"] == "gcr.io/my-proj/trainer:1"
    assert chief["command"] == ["python", "-m", "trainer.task"]
    assert chief["args"] == ["--epochs", "2", "--job-dir", "gs://mljob-test/cc/job01"]
    assert worker["imageUri"].startswith("gcr.io/my-proj/worker@sha256:")
    assert "command" not in worker and ps["args"] == ["--role", "ps"]
    assert [p["replicaCount"] for p in pools] == ["1", "2", "1"]


def test_image_flags_over_the_config_and_basic_tier(capsys, tmp_path):
    out = dry(capsys, "--runner", "kubeflow", "--job-dir", "gs://mljob-test/cc/job01",
              "--scale-tier", "standard-1", "--master-image-uri", "gcr.io/p/m:1",
              "--parameter-server-image-uri", "gcr.io/p/ps:1")
    specs = yaml.safe_load("apiVersion:" + out.split("apiVersion:", 1)[1])["spec"][
        "tfReplicaSpecs"]
    images = {kind: s["template"]["spec"]["containers"][0]["image"]
              for kind, s in specs.items()}
    assert images == {"Chief": "gcr.io/p/m:1", "Worker": "gcr.io/p/m:1",
                      "PS": "gcr.io/p/ps:1"}


def test_a_kubeflow_container_job_is_created_without_image_or_package(
        capsys, config, tmp_path, monkeypatch, gcs_emulator):
    """Created through the Kubernetes client against the recording endpoint: no --image
    needed, nothing staged, the record without a package."""
    from tests.support.api_edge import ApiEdge
    with ApiEdge() as api:
        kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "edge",
                      "clusters": [{"name": "edge", "cluster": {"server": api.url}}],
                      "users": [{"name": "me", "user": {"token": "t"}}],
                      "contexts": [{"name": "edge", "context": {"cluster": "edge",
                                                                "user": "me"}}]}
        (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
        api.route("POST", r"/apis/kubeflow.org/v1/namespaces/default/tfjobs", 201,
                  lambda req: req.json())
        job_dir = "gs://mljob-test/cc/job02"
        status, out, err = run(capsys, "jobs", "submit", "training", "job02", "--runner",
                               "kubeflow", "--job-dir", job_dir, "--config", config,
                               "--async")
        assert status == 0, err
        body = api.requests[-1].json()
        chief = body["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]
        assert chief["image"] == "gcr.io/my-proj/trainer:1"
    record = records.load("job02")
    assert record.package_url is None and record.runner == "kubeflow"
    from mljob import storage
    assert not storage.exists(job_dir + "/packages")


@pytest.mark.parametrize("argv,words", [
    (["--master-image-uri", "gcr.io/p/t 1"], "is not a container image"),
    (["--master-image-uri", "Gcr.io/p/t:1"], "is not a container image"),
    (["--worker-image-uri", "gcr.io/p/w:1", "--scale-tier", "standard-1"],
     "needs the master's image too"),
    (["--master-image-uri", "gcr.io/p/t:1", "--package-path", "."],
     "give it or a package (--package-path, --packages, packageUris), not both"),
    (["--config", "{command_no_image}"], "has containerCommand or containerArgs but no "
                                         "image"),
    (["--config", "{command_string}"], "containerCommand must be a list of strings"),
    (["--config", "{command_empty}"], "containerCommand is empty"),
    (["--config", "{image_number}"], "masterConfig.imageUri 7 is not a container image"),
    (["--runner", "kubeflow", "--job-dir", "gs://mljob-test/x", "--image", "r/i:1",
      "--master-image-uri", "gcr.io/p/t:1"], "drop --image"),
])
def test_container_mistakes_are_one_line(capsys, tmp_path, argv, words):
    configs = {
        "command_no_image": "trainingInput:\n  masterConfig: {containerCommand: [run]}\n",
        "command_string": "trainingInput:\n  masterConfig: {imageUri: g/t, "
                          "containerCommand: run}\n",
        "command_empty": "trainingInput:\n  masterConfig: {imageUri: g/t, "
                         "containerCommand: []}\n",
        "image_number": "trainingInput:\n  masterConfig: {imageUri: 7}\n"}
    for i, arg in enumerate(argv):
        if arg.startswith("{"):
            path = tmp_path / "config.yaml"
            path.write_text(configs[arg[1:-1]])
            argv[i] = str(path)
    if "--job-dir" not in argv:
        argv = [*argv, "--job-dir", str(tmp_path / "job")]
    status, out, err = run(capsys, "job01", *argv)
    assert status == 2 and out == ""
    assert words in one_error_line(err)
    nothing_written(tmp_path / "job")
