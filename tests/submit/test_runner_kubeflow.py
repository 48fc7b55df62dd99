"""`--runner kubeflow`: the TFJob we render, checked against the Kubeflow training SDK's
own TFJob models and golden copies, its Dockerfile run for real, and the official
kubernetes client's calls (create, status, logs, cancel) sent over HTTP to a recording
endpoint on 127.0.0.1 found through a real kubeconfig.

Goldens: `MLJOB_UPDATE_GOLDEN=1 python -m pytest tests/test_runner_kubeflow.py` rewrites
tests/golden/tfjob_*.yaml after a deliberate change; review the diff before committing.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from tests.support.api_edge import ApiEdge
from tests.support.common import ROOT
from submit import jobs as records
from submit.packaging import package as packages
from submit.home import mljob_home
from submit.jobdef import spec as specs
from submit.__main__ import main
from submit.errors import SubmitError, UsageError
from submit.packaging.package import Package
from submit.runners import get as get_runner
from submit.runners.engine import EngineOptions

kubeflow = pytest.importorskip("submit.runners.kubeflow")
from kubeflow.training.api_client import ApiClient  # noqa: E402

GOLDEN = os.path.join(ROOT, "tests", "golden")
SHA = "0" * 64
PACKAGE = Package(file_name="mljob-0.1.0.tar.gz", sha256=SHA, top_dir="mljob-0.1.0",
                  url=f"gs://mljob-staging/job01/{SHA}/mljob-0.1.0.tar.gz")
IMAGE = "registry.example.com/ml/mljob-trainer:0.1.0"
CUSTOM = {  # every kind of replica, a GPU chief, legacy master, restarts, Compute Engine types
    "scaleTier": "CUSTOM", "masterType": "standard_gpu",
    "masterConfig": {"acceleratorConfig": {"count": 1, "type": "NVIDIA_TESLA_T4"}},
    "workerType": "large_model", "workerCount": 2,
    "workerConfig": {"restartPolicy": "ExitCode", "maxRestarts": 3},
    "parameterServerType": "n1-highmem-2", "parameterServerCount": 1,
    "parameterServerConfig": {"restartPolicy": "OnFailure", "maxRestarts": 5},
    "evaluatorType": "complex_model_s", "evaluatorCount": 1,
    "useChiefInTfConfig": False,
    "args": ["--model", "cnn", "--train-steps", "5000"]}
CASES = {
    "standard_1": dict(training_input={}, scale_tier="STANDARD_1",
                       args=["--model", "mlp"]),
    "custom_evaluator": dict(training_input=CUSTOM),
}


def resolve(case: str, job_dir="gs://mljob-test/jobs/job01", job_id="job01"):
    kwargs = dict(CASES[case])
    ti = specs.training_config(kwargs.pop("training_input"))
    return specs.resolve(specs.Flags(job_id, job_dir=job_dir,
                                     staging_bucket="gs://mljob-staging", **kwargs), ti)


def engine(**options):
    options.setdefault("image", IMAGE)
    return kubeflow.KubeflowEngine(EngineOptions(**options))


def sdk_round_trip(body: dict) -> dict:
    """Deserialise into the SDK's KubeflowOrgV1TFJob and serialise back: a field the
    TFJob models do not know is dropped, and a required one missing raises."""
    client = ApiClient()

    class Response:
        data = json.dumps(body)
    model = client.deserialize(Response(), "KubeflowOrgV1TFJob")
    return client.sanitize_for_serialization(model)


# --- the rendered TFJob --------------------------------------------------------------

@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_tfjob_matches_golden_and_the_sdk_models(case):
    rendered = engine(namespace="ml-team").render(resolve(case), PACKAGE)
    path = os.path.join(GOLDEN, f"tfjob_{case}.yaml")
    if os.environ.get("MLJOB_UPDATE_GOLDEN"):
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "w") as f:
            f.write(rendered.text)
    with open(path) as f:
        assert rendered.text == f.read(), f"rendered TFJob differs from {path}"
    assert yaml.safe_load(rendered.text) == rendered.body  # the comments are the only extra
    assert sdk_round_trip(rendered.body) == rendered.body


def test_pods_stop_in_the_order_that_keeps_the_chiefs_work():
    """The operator deletes the running evaluator when the chief succeeds, and a cancel
    deletes every pod at once: each pod's grace period outlasts the stop watchdog (the
    chief saves, the evaluator has its last look), and the ps and workers wait in a
    preStop hook while the chief still answers at its TF_CONFIG address
    (docs/engines.md)."""
    from mljob.contracts import STOP_DEADLINE_SECONDS
    replicas = engine(namespace="ml").render(resolve("custom_evaluator"), PACKAGE).body[
        "spec"]["tfReplicaSpecs"]
    grace = {kind: r["template"]["spec"].get("terminationGracePeriodSeconds")
             for kind, r in replicas.items()}
    assert grace == {"Master": 90, "Worker": 90, "PS": 90, "Evaluator": 90}
    assert grace["Evaluator"] > STOP_DEADLINE_SECONDS
    hooks = {kind: r["template"]["spec"]["containers"][0].get("lifecycle")
             for kind, r in replicas.items()}
    assert hooks["Master"] is None and hooks["Evaluator"] is None
    assert hooks["Worker"] == hooks["PS"]
    command = hooks["PS"]["preStop"]["exec"]["command"]
    assert command[:2] == ["python", "-c"]
    # the hook itself, run as the kubelet would: it waits while the chief answers and
    # returns once the chief has gone
    import socket
    import subprocess
    import sys
    import time
    chief = socket.socket()
    chief.bind(("127.0.0.1", 0))
    chief.listen(8)
    port = chief.getsockname()[1]
    env = {**os.environ, "TF_CONFIG": json.dumps(
        {"cluster": {"master": [f"127.0.0.1:{port}"], "ps": ["127.0.0.1:1"]},
         "task": {"type": "ps", "index": 0}})}
    hook = subprocess.Popen([sys.executable, "-c", command[2]], env=env)
    try:
        time.sleep(1.5)
        assert hook.poll() is None            # the chief still answers: the ps waits
        chief.close()
        started = time.monotonic()
        assert hook.wait(10) == 0 and time.monotonic() - started < 5
    finally:
        hook.kill()
        hook.wait()
        chief.close()


def test_the_sdk_check_catches_a_misspelt_field():
    body = engine(namespace="ml").render(resolve("standard_1"), PACKAGE).body
    spec = body["spec"]["tfReplicaSpecs"]["Chief"]
    spec["restartpolicy"] = spec.pop("restartPolicy")
    assert sdk_round_trip(body) != body


def test_standard_1_replicas_command_and_resources():
    body = engine(namespace="ml").render(resolve("standard_1"), PACKAGE).body
    assert body["apiVersion"] == "kubeflow.org/v1" and body["kind"] == "TFJob"
    assert body["metadata"]["name"] == "job01" and body["metadata"]["namespace"] == "ml"
    replicas = body["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in replicas.items()} == \
        {"Chief": 1, "Worker": 4, "PS": 3}
    assert body["spec"]["runPolicy"] == {"cleanPodPolicy": "Running"}
    for replica in replicas.values():
        assert replica["restartPolicy"] == "Never"
        (container,) = replica["template"]["spec"]["containers"]
        assert container["name"] == "tensorflow" and container["image"] == IMAGE
        assert container["ports"] == [{"name": "tfjob-port", "containerPort": 2222}]
        assert container["command"] == ["python", "-m", "mljob.fitting.launch",
                                        "trainer.task"]
        assert container["args"] == ["--model", "mlp", "--job-dir",
                                     "gs://mljob-test/jobs/job01"]
        assert container["resources"] == {"requests": {"cpu": "4", "memory": "15360Mi"},
                                          "limits": {"memory": "15360Mi"}}
        assert {"name": "CLOUD_ML_JOB_ID", "value": "job01"} in container["env"]


def test_custom_config_maps_machines_gpus_restarts_and_master():
    body = engine(namespace="ml", service_account="trainer-sa").render(
        resolve("custom_evaluator"), PACKAGE).body
    replicas = body["spec"]["tfReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker", "PS", "Evaluator"}  # useChiefInTfConfig
    assert {k: v["replicas"] for k, v in replicas.items()} == \
        {"Master": 1, "Worker": 2, "PS": 1, "Evaluator": 1}
    assert {k: v["restartPolicy"] for k, v in replicas.items()} == \
        {"Master": "Never", "Worker": "ExitCode", "PS": "OnFailure", "Evaluator": "Never"}
    assert body["spec"]["runPolicy"]["backoffLimit"] == 5
    pods = {k: v["template"]["spec"] for k, v in replicas.items()}
    resources = {k: p["containers"][0]["resources"] for k, p in pods.items()}
    assert resources["Master"]["requests"] == {"cpu": "8", "memory": "30720Mi"}
    assert resources["Master"]["limits"]["nvidia.com/gpu"] == "1"
    assert pods["Master"]["nodeSelector"] == {
        "cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}
    assert resources["Worker"]["requests"] == {"cpu": "8", "memory": "53248Mi"}
    assert resources["PS"]["requests"] == {"cpu": "2", "memory": "13312Mi"}
    assert resources["Evaluator"]["requests"] == {"cpu": "8", "memory": "7373Mi"}
    assert all("nvidia.com/gpu" not in resources[k]["limits"]
               for k in ("Worker", "PS", "Evaluator"))
    assert all(p["serviceAccountName"] == "trainer-sa" for p in pods.values())
    assert pods["Worker"]["containers"][0]["args"][-2:] == \
        ["--job-dir", "gs://mljob-test/jobs/job01"]
    assert "FROM tensorflow/tensorflow:2.21.0-gpu" in \
        engine().render(resolve("custom_evaluator"), PACKAGE).text


def test_every_cloud_ml_machine_type_has_resources():
    for machine in specs.MACHINE_TYPES:
        cpus, memory, gpus = kubeflow.machine_resources(machine, 0)
        assert cpus >= 4 and memory >= 7 and (gpus > 0) == any(
            name in machine for name in ("gpu", "p100", "v100")), machine


@pytest.mark.parametrize("job_dir,expected", [
    (None, "needs --job-dir gs://BUCKET/PATH"),
    ("/tmp/jobs/job01", "cannot reach /tmp/jobs/job01"),
    ("memory://jobs/job01", "cannot reach memory://jobs/job01"),
])
def test_job_dir_must_be_gs(job_dir, expected):
    with pytest.raises(UsageError, match=expected):
        engine().check(resolve("standard_1", job_dir=job_dir))


def test_names_that_kubernetes_refuses():
    assert kubeflow.tfjob_name("Job_01") == "job-01"
    with pytest.raises(UsageError, match="at most 50 characters"):
        engine().check(resolve("standard_1", job_id="j" * 51))
    with pytest.raises(UsageError, match="ending in a letter or digit"):
        engine().check(resolve("standard_1", job_id="job_"))
    with pytest.raises(UsageError, match="not a Kubernetes namespace name"):
        engine(namespace="Team_A").check(resolve("standard_1"))


def test_dockerfile_installs_the_sdist_without_replacing_tensorflow(tmp_path):
    """The Dockerfile's RUN step, run in a virtualenv that sees this interpreter's
    packages (as the image sees TensorFlow's): the trainer imports, its dependencies are
    satisfied, and no second TensorFlow is installed."""
    pkg = packages.build(ROOT, str(tmp_path / "build"))
    folder = kubeflow.build_context(pkg, gpu=False)
    assert sorted(os.listdir(folder)) == ["Dockerfile", pkg.file_name]
    with open(os.path.join(folder, "Dockerfile")) as f:
        lines = f.read().splitlines()
    assert lines[1] == "FROM tensorflow/tensorflow:2.21.0"
    assert lines[2] == f"COPY {pkg.file_name} /tmp/mljob-packages/{pkg.file_name}"
    run = " ".join(line[4:] if line.startswith("RUN ") else line
                   for line in lines if line.startswith(("RUN ", " && ")))
    run = run.replace(" \\", "").replace(" && rm -r /tmp/mljob-packages", "")
    run = run.replace("/tmp/mljob-packages", folder)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    env = {**os.environ, "PATH": f"{venv}/bin:{os.environ['PATH']}",
           "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    subprocess.run(["bash", "-c", run], check=True, env=env, cwd=tmp_path,
                   capture_output=True)
    out = subprocess.run(
        [f"{venv}/bin/python", "-c", "import importlib.metadata as m, trainer.task, "
         "submit.local.plan, predict.api.rest; print(m.distribution('mljob').locate_file(''))"],
        check=True, env=env, cwd=tmp_path, capture_output=True, text=True).stdout
    assert out.strip().startswith(str(venv))  # installed into the image's environment
    site = subprocess.run([f"{venv}/bin/python", "-m", "pip", "list", "--local",
                           "--format", "json"], env=env, capture_output=True, text=True,
                          check=True).stdout
    names = [p["name"] for p in json.loads(site)]
    assert "mljob" in names and not any(n.startswith("tensorflow") for n in names)


# --- the kubernetes client against a recording endpoint ------------------------------

@pytest.fixture
def api(tmp_path, monkeypatch):
    """An ApiEdge and a kubeconfig whose current context points at it."""
    with ApiEdge() as edge:
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "edge",
                  "clusters": [{"name": "edge", "cluster": {"server": edge.url}}],
                  "users": [{"name": "me", "user": {"token": "t0ken"}}],
                  "contexts": [{"name": "edge", "context": {
                      "cluster": "edge", "user": "me", "namespace": "team-a"}}]}
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        monkeypatch.setenv("KUBECONFIG", str(path))
        yield edge


TFJOBS = r"/apis/kubeflow.org/v1/namespaces/team-a/tfjobs"
PODS = r"/api/v1/namespaces/team-a/pods"


def pod(kind: str, index: int, phase: str, exit_code=None, restarts=0) -> dict:
    state = {"terminated": {"exitCode": exit_code}} if exit_code is not None else \
        {"waiting": {"reason": "ContainerCreating"}} if phase == "Pending" else \
        {"running": {"startedAt": "2026-11-22T10:00:00Z"}}
    return {"metadata": {"name": f"job01-{kind}-{index}", "labels": {
        "training.kubeflow.org/job-name": "job01",
        "training.kubeflow.org/replica-type": kind,
        "training.kubeflow.org/replica-index": str(index)}},
        "status": {"phase": phase, "containerStatuses": [{
            "name": "tensorflow", "restartCount": restarts, "state": state,
            "ready": phase == "Running", "image": IMAGE, "imageID": "",
            "started": phase == "Running"}]}}


def tfjob(*conditions, message="") -> dict:
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
            "metadata": {"name": "job01", "namespace": "team-a", "uid": "u-1"},
            "status": {"conditions": [{"type": c, "status": "True", "message": message}
                                      for c in conditions]}}


def test_create_posts_the_rendered_tfjob_with_the_kubeconfig(api):
    eng = kubeflow.KubeflowEngine(EngineOptions(image=IMAGE))
    rendered = eng.render(resolve("standard_1"), PACKAGE)
    assert rendered.body["metadata"]["namespace"] == "team-a"  # the context's namespace
    api.route("POST", TFJOBS, 201, lambda req: {**req.json(), "metadata": {
        **req.json()["metadata"], "uid": "u-1"}})
    handle = eng.create(rendered)
    (request,) = api.requests
    assert request.method == "POST" and request.path == TFJOBS.replace("\\", "")
    assert request.headers["authorization"] == "Bearer t0ken"
    assert request.json() == rendered.body
    assert handle == {"name": "job01", "namespace": "team-a", "context": "edge",
                      "uid": "u-1"}


@pytest.mark.parametrize("status,body,error,expected", [
    (409, {"message": 'tfjobs.kubeflow.org "job01" already exists'}, SubmitError,
     "a TFJob named job01 already exists in namespace team-a; cancel it"),
    (404, {"message": 'namespaces "team-a" not found'}, UsageError,
     "namespace team-a does not exist"),
    (404, {"message": "the server could not find the requested resource"}, SubmitError,
     "the cluster has no TFJob resource .* install the Kubeflow Training Operator"),
    (403, {"message": 'tfjobs.kubeflow.org is forbidden: User "me" cannot create'},
     SubmitError, "cannot create the TFJob in namespace team-a: .*forbidden.* RBAC"),
])
def test_create_errors_are_one_line_with_a_fix(api, status, body, error, expected):
    api.route("POST", TFJOBS, status, {"kind": "Status", "code": status, **body})
    eng = kubeflow.KubeflowEngine(EngineOptions(image=IMAGE))
    with pytest.raises(error, match=expected) as info:
        eng.create(eng.render(resolve("standard_1"), PACKAGE))
    assert "\n" not in str(info.value)


def test_unreachable_cluster_and_missing_kubeconfig(api, tmp_path, monkeypatch):
    eng = kubeflow.KubeflowEngine(EngineOptions(image=IMAGE))
    rendered = eng.render(resolve("standard_1"), PACKAGE)
    api.__exit__(None, None, None)  # nobody listens there any more
    with pytest.raises(SubmitError, match="cannot reach the Kubernetes API"):
        eng.create(rendered)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(UsageError, match="no usable kubeconfig"):  # a later command
        kubeflow.KubeflowEngine(EngineOptions(image=IMAGE)).create(rendered)


def test_status_maps_conditions_and_pods(api):
    handle = {"name": "job01", "namespace": "team-a", "context": "edge"}
    api.route("GET", TFJOBS + "/job01", 200, tfjob("Created", "Running"))
    api.route("GET", PODS, 200, {"items": [
        pod("worker", 1, "Running", restarts=2), pod("chief", 0, "Running"),
        pod("ps", 0, "Failed", exit_code=137)]})
    eng = get_runner("kubeflow")(EngineOptions())
    status = eng.status(handle)
    assert status.state == records.RUNNING and status.message is None
    assert [(r.label, r.state, r.exit_code, r.restarts) for r in status.replicas] == [
        ("master-replica-0", "RUNNING", None, 0), ("ps-replica-0", "FAILED", 137, 0),
        ("worker-replica-1", "RUNNING", None, 2)]
    selector = api.requests[-1].query["labelSelector"]
    assert selector == ["training.kubeflow.org/job-name=job01"]
    api.route("GET", TFJOBS + "/job01", 200,
              tfjob("Created", "Running", "Failed", message="chief exited with code 1"))
    assert (eng.status(handle).state, eng.status(handle).message) == \
        (records.FAILED, "chief exited with code 1")
    api.route("GET", TFJOBS + "/job01", 404, {"message": "not found"})
    assert eng.status(handle).state == records.CANCELLED


def test_logs_are_labelled_per_replica_and_follow_ends_with_the_job(api):
    handle = {"name": "job01", "namespace": "team-a", "context": "edge"}
    api.route("GET", TFJOBS + "/job01", 200, tfjob("Created", "Succeeded"))
    api.route("GET", PODS, 200, {"items": [
        pod("chief", 0, "Succeeded", exit_code=0), pod("worker", 0, "Running"),
        pod("ps", 0, "Pending")]})
    api.route("GET", PODS + "/job01-chief-0/log", 200,
              "2026-11-22T10:00:01.5Z training started: strategy=ps\n"
              "2026-11-22T10:00:09.0Z exported model to gs://b/model\n", "text/plain")
    api.route("GET", PODS + "/job01-worker-0/log", 200,
              "2026-11-22T10:00:02.0Z worker ready\n", "text/plain")
    eng = get_runner("kubeflow")(EngineOptions())
    lines = list(eng.logs(handle, follow=True))
    assert sorted(line.split("\t", 2)[2] for line in lines) == [
        "master-replica-0\texported model to gs://b/model",
        "master-replica-0\ttraining started: strategy=ps",
        "worker-replica-0\tworker ready"]
    assert any(line.startswith("INFO\t2026-11-22 10:00:01 +0000\tmaster-replica-0")
               for line in lines)
    logs = {r.path: r.query for r in api.requests if r.path.endswith("/log")}
    assert logs["/api/v1/namespaces/team-a/pods/job01-worker-0/log"]["follow"] == ["True"]
    assert logs["/api/v1/namespaces/team-a/pods/job01-chief-0/log"].get("follow") in (
        None, ["False"])  # a finished container is read once
    assert all(q["container"] == ["tensorflow"] for q in logs.values())
    only = list(eng.logs(handle, task_name="worker-replica-0", follow=False))
    assert [line.split("\t")[2] for line in only] == ["worker-replica-0"]
    with pytest.raises(UsageError, match="--task-name 'chief-0' names no replica"):
        list(eng.logs(handle, task_name="chief-0"))


def test_cancel_deletes_the_tfjob_in_the_foreground(api):
    handle = {"name": "job01", "namespace": "team-a", "context": "edge"}
    api.route("DELETE", TFJOBS + "/job01", 200, {"kind": "Status", "status": "Success"})
    eng = get_runner("kubeflow")(EngineOptions())
    assert eng.cancel(handle) == records.CANCELLED
    (request,) = api.requests
    assert request.method == "DELETE"
    assert request.query["propagationPolicy"] == ["Foreground"]  # pods go first
    api.route("DELETE", TFJOBS + "/job01", 404, {"message": "not found"})
    assert eng.cancel(handle) == records.CANCELLED  # already gone is cancelled too


# --- through the CLI ------------------------------------------------------------------

def cli(capsys, *argv):
    status = main(list(argv), standalone_mode=False)
    out, err = capsys.readouterr()
    return status, out, err


def test_cli_dry_run_prints_applyable_yaml_and_the_build_context(capsys):
    status, out, err = cli(capsys, "job01", "--runner", "kubeflow", "--scale-tier",
                           "STANDARD_1", "--job-dir", "gs://mljob-test/kf/job01",
                           "--namespace", "ml", "--image", IMAGE, "--dry-run")
    assert status == 0, err
    body = yaml.safe_load(out)
    assert body["kind"] == "TFJob" and body["metadata"]["namespace"] == "ml"
    assert sdk_round_trip(body) == body
    assert "docker build -t " + IMAGE in err and "docker push" in err
    context = err.split("is ", 1)[1].split(";", 1)[0]
    assert os.path.isfile(os.path.join(context, "Dockerfile"))


@pytest.mark.parametrize("argv,expected", [
    (["--project", "p"], "--project is for --runner vertex, not --runner kubeflow"),
    (["--runner", "local", "--namespace", "ml"],
     "--namespace is for --runner kubeflow, not --runner local"),
    (["--job-dir", "/tmp/x"], "--runner kubeflow needs --job-dir gs://"),
])
def test_cli_usage_errors(capsys, argv, expected):
    base = ["job01", "--runner", "kubeflow", "--job-dir", "gs://mljob-test/kf/job01"]
    if "--runner" in argv:
        base = ["job01", "--job-dir", "gs://mljob-test/kf/job01"]
    status, out, err = cli(capsys, *base, *argv, "--dry-run")
    assert status == 2 and err.startswith("error: ") and expected in err
    assert err.count("\n") == 1


def test_cli_submit_describe_stream_cancel(api, capsys, gcs_emulator):
    """A whole life through the CLI: the package is staged to (emulated) GCS, the TFJob
    created, and the job record drives describe, stream-logs and cancel."""
    job_dir = "gs://mljob-test/kf/cli01"
    status, out, err = cli(capsys, "cli01", "--runner", "kubeflow", "--job-dir", job_dir,
                           "--async")
    assert status == 2 and "needs --image" in err and not api.requests

    api.route("POST", TFJOBS, 201, lambda req: req.json())
    status, out, err = cli(capsys, "cli01", "--runner", "kubeflow", "--job-dir", job_dir,
                           "--image", IMAGE, "--async", "--", "--model", "mlp")
    assert status == 0, err
    assert "Job [cli01] submitted successfully to kubeflow." in out
    body = api.requests[-1].json()
    assert body["metadata"]["name"] == "cli01"
    container = body["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["--model", "mlp", "--job-dir", job_dir]
    from mljob import storage
    staged = body["metadata"]["annotations"]["mljob/package-uri"]
    assert staged.startswith(job_dir + "/packages/") and storage.exists(staged)
    record = records.load("cli01")
    assert record.runner == "kubeflow" and record.state == records.QUEUED
    assert record.engine["namespace"] == "team-a" and record.engine["context"] == "edge"

    api.route("GET", TFJOBS + "/cli01", 200, tfjob("Created", "Running"))
    api.route("GET", PODS, 200, {"items": [pod("chief", 0, "Running")]})
    status, out, err = cli(capsys, "jobs", "describe", "cli01")
    assert status == 0 and "state: RUNNING" in out and "runner: kubeflow" in out
    assert records.load("cli01").replica("master-replica-0").state == "RUNNING"

    api.route("GET", TFJOBS + "/cli01", 200, tfjob("Created", "Running", "Succeeded"))
    api.route("GET", PODS, 200, {"items": [pod("chief", 0, "Succeeded", exit_code=0)]})
    api.route("GET", PODS + "/job01-chief-0/log", 200,
              "2026-11-22T10:00:01Z step 10/10 loss=0.5\n", "text/plain")
    status, out, err = cli(capsys, "jobs", "stream-logs", "cli01")
    assert status == 0, err
    assert "master-replica-0\tstep 10/10 loss=0.5" in out and "Job [cli01] SUCCEEDED." in out
    api.route("GET", TFJOBS + "/cli01", 404, {"message": "not found"})  # cleaned away
    status, out, err = cli(capsys, "jobs", "describe", "cli01")
    assert status == 0 and "state: SUCCEEDED" in out  # an ended job stays as it ended
    status, out, err = cli(capsys, "jobs", "cancel", "cli01")
    assert status == 2 and "already ended SUCCEEDED" in err

    record = records.load("cli01")  # as if it were still running: cancel asks first
    record.set_state(records.RUNNING)
    records.save(record)
    api.route("GET", TFJOBS + "/cli01", 200, tfjob("Created", "Succeeded"))
    status, out, err = cli(capsys, "jobs", "cancel", "cli01")
    assert status == 2 and "already ended SUCCEEDED" in err  # the engine's word, not ours
    assert api.requests[-1].method != "DELETE"
    record.set_state(records.RUNNING)
    records.save(record)
    api.route("GET", TFJOBS + "/cli01", 200, tfjob("Created", "Running"))
    api.route("DELETE", TFJOBS + "/cli01", 200, {"kind": "Status", "status": "Success"})
    status, out, err = cli(capsys, "jobs", "cancel", "cli01")
    assert status == 0 and "Job [cli01] CANCELLED." in out
    assert api.requests[-1].method == "DELETE"
    assert records.load("cli01").state == records.CANCELLED


def test_multi_gpu_machines_and_gpu_images_are_their_own():
    spec = specs.resolve(specs.Flags("job01", job_dir="gs://mljob-test/jobs/job01"),
                         specs.training_config({
                             "scaleTier": "CUSTOM", "masterType": "standard",
                             "workerType": "complex_model_m_gpu", "workerCount": 1}))
    body = engine().render(spec, PACKAGE).body
    worker = body["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert "nvidia.com/gpu" not in body["spec"]["tfReplicaSpecs"]["Chief"]["template"][
        "spec"]["containers"][0]["resources"]["limits"]


def test_dockerfile_leaves_out_tensorflow_itself_only():
    import re
    text = kubeflow.dockerfile(PACKAGE, gpu=False)
    pattern = re.search(r're\.match\(r"(.+?)", q\)', text).group(1)
    dropped = [q for q in ("tensorflow", "tensorflow-cpu==2.21.*", "tensorflow[and-cuda]",
                           "tensorflow-gpu>=2", "tensorflow-datasets", "tensorflow_hub",
                           "tensorflow-probability==0.25", "tensorboard")
               if re.match(pattern, q)]
    assert dropped == ["tensorflow", "tensorflow-cpu==2.21.*", "tensorflow[and-cuda]",
                       "tensorflow-gpu>=2"]


def test_build_contexts_of_cpu_and_gpu_images_are_apart(tmp_path):
    sdist = tmp_path / PACKAGE.file_name
    sdist.write_bytes(b"not really an sdist")
    pkg = Package(**{**PACKAGE.__dict__, "local_file": str(sdist)})
    cpu, gpu = kubeflow.build_context(pkg, gpu=False), kubeflow.build_context(pkg, gpu=True)
    assert cpu != gpu
    for folder, base in ((cpu, "tensorflow/tensorflow:2.21.0\n"),
                         (gpu, "tensorflow/tensorflow:2.21.0-gpu\n")):
        with open(os.path.join(folder, "Dockerfile")) as f:
            assert f.read().splitlines(keepends=True)[1] == "FROM " + base


def test_the_image_installs_the_users_package_and_mljobs_core(capsys, tmp_path):
    folder = tmp_path / "trainer"
    folder.mkdir()
    (folder / "task.py").write_text("import mljob.storage\n")
    status, out, err = cli(capsys, "job01", "--runner", "kubeflow", "--job-dir",
                           "gs://mljob-test/kf/job01", "--image", IMAGE, "--package-path",
                           str(folder), "--module-name", "trainer.task", "--dry-run")
    assert status == 0, err
    context = err.split("is ", 1)[1].split(";", 1)[0]
    assert sorted(os.listdir(context)) == ["Dockerfile", "mljob-0.1.0.tar.gz",
                                           "trainer-0.0.0.tar.gz"]
    with open(os.path.join(context, "Dockerfile")) as f:
        docker = f.read()
    assert ("RUN pip install --no-cache-dir --no-deps /tmp/mljob-packages/trainer-0.0.0"
            ".tar.gz /tmp/mljob-packages/mljob-0.1.0.tar.gz") in docker
    assert "COPY mljob-0.1.0.tar.gz /tmp/mljob-packages/mljob-0.1.0.tar.gz" in docker


def test_a_dry_run_with_a_staged_archive_writes_no_half_build_context(capsys, tmp_path):
    # The dry run builds the package but leaves the staged --packages archive where it
    # is: the TFJob and its Dockerfile are printed, and no context lacking it is written.
    folder = tmp_path / "trainer"
    folder.mkdir()
    (folder / "task.py").write_text("print('training')\n")
    status, out, err = cli(capsys, "job01", "--runner", "kubeflow", "--job-dir",
                           "gs://mljob-test/kf/job01", "--image", IMAGE, "--package-path",
                           str(folder), "--module-name", "trainer.task", "--packages",
                           "gs://mljob-test/staged/extra-1.0.tar.gz", "--dry-run")
    assert status == 0, err
    assert yaml.safe_load(out)["kind"] == "TFJob"
    assert "COPY extra-1.0.tar.gz /tmp/mljob-packages/extra-1.0.tar.gz" in out
    assert "build context is written when the job is submitted" in err
    assert "extra-1.0.tar.gz" in err and "docker build" not in err
    assert not os.path.exists(os.path.join(mljob_home(), "images"))
# --- tuning: a Katib Experiment around the TFJob ----------------------------------------

HP = {"goal": "MAXIMIZE", "hyperparameterMetricTag": "accuracy", "maxTrials": 8,
      "maxParallelTrials": 2, "maxFailedTrials": 3, "enableTrialEarlyStopping": True,
      "params": [{"parameterName": "learning_rate", "type": "DOUBLE", "minValue": 1e-4,
                  "maxValue": 0.1, "scaleType": "UNIT_LOG_SCALE"},
                 {"parameterName": "hidden_units", "type": "INTEGER", "minValue": 16,
                  "maxValue": 256},
                 {"parameterName": "batch_size", "type": "DISCRETE",
                  "discreteValues": [32, 64, 128]}]}
EXPERIMENTS = r"/apis/kubeflow.org/v1beta1/namespaces/team-a/experiments"


def tuning(hp=None, job_id="tune01"):
    return specs.resolve(specs.Flags(job_id, job_dir="gs://mljob-test/jobs/tune01",
                                     staging_bucket="gs://mljob-staging"),
                         specs.training_config({**CUSTOM, "hyperparameters": hp or HP}))


def test_tuning_renders_a_katib_experiment_matching_golden_and_the_sdk_models():
    from kubeflow_katib_api.models import V1beta1Experiment
    rendered = engine(namespace="ml-team").render(tuning(), PACKAGE)
    path = os.path.join(GOLDEN, "katib_experiment.yaml")
    if os.environ.get("MLJOB_UPDATE_GOLDEN"):
        with open(path, "w") as f:
            f.write(rendered.text)
    with open(path) as f:
        assert rendered.text == f.read(), f"rendered Experiment differs from {path}"
    body = rendered.body
    assert yaml.safe_load(rendered.text) == body
    assert not re.search(r"[&*]id[0-9]", rendered.text)  # no YAML anchors or aliases
    assert V1beta1Experiment.from_dict(body).to_dict() == body  # Katib's own models
    assert (body["apiVersion"], body["kind"]) == ("kubeflow.org/v1beta1", "Experiment")
    spec = body["spec"]
    assert (spec["maxTrialCount"], spec["parallelTrialCount"],
            spec["maxFailedTrialCount"]) == (8, 2, 3)
    assert spec["objective"] == {"type": "maximize", "objectiveMetricName": "accuracy"}
    assert spec["algorithm"] == {"algorithmName": "tpe"}
    assert spec["earlyStopping"]["algorithmName"] == "medianstop"
    lr, units, batch = spec["parameters"]
    assert lr == {"name": "learning_rate", "parameterType": "double", "feasibleSpace": {
        "min": "0.0001", "max": "0.1", "distribution": "logUniform"}}
    assert units["parameterType"] == "int" and units["feasibleSpace"]["max"] == "256"
    assert batch["feasibleSpace"] == {"list": ["32", "64", "128"]}
    # the trial is today's TFJob (the SDK reads it), each parameter a flag after the
    # user's args, the job dir per trial, and the hypertune file where Katib reads it
    template = spec["trialTemplate"]
    trial = template["trialSpec"]
    assert sdk_round_trip({**trial, "metadata": {}})["spec"] == trial["spec"]
    plain = engine(namespace="ml-team").render(resolve("custom_evaluator"), PACKAGE).body
    assert set(trial["spec"]["tfReplicaSpecs"]) == set(plain["spec"]["tfReplicaSpecs"])
    container = trial["spec"]["tfReplicaSpecs"]["Master"]["template"]["spec"][
        "containers"][0]
    assert container["args"] == CUSTOM["args"] + [
        "--learning_rate=${trialParameters.learning_rate}",
        "--hidden_units=${trialParameters.hidden_units}",
        "--batch_size=${trialParameters.batch_size}",
        "--job-dir", "gs://mljob-test/jobs/tune01/${trialSpec.Name}"]
    env = {e["name"]: e["value"] for e in container["env"]}
    collector = spec["metricsCollectorSpec"]
    assert collector["collector"] == {"kind": "File"}
    assert collector["source"]["fileSystemPath"] == {
        "path": env["CLOUD_ML_HP_METRIC_FILE"], "kind": "File", "format": "JSON"}
    assert env["CLOUD_ML_HP_METRIC_TAG"] == "accuracy"
    assert env["CLOUD_ML_TRIAL_ID"] == "${trialSpec.Name}"
    assert [p["reference"] for p in template["trialParameters"]] == [
        "learning_rate", "hidden_units", "batch_size"]


def test_the_trainer_metrics_file_is_what_katib_json_collector_reads(tmp_path):
    """Katib's File collector in JSON format reads each line as an object whose metric
    values are strings and whose `timestamp` is a number or RFC 3339 text."""
    from mljob import hypertune
    env = {"CLOUD_ML_HP_METRIC_FILE": str(tmp_path / "m"), "CLOUD_ML_TRIAL_ID": "t-1",
           "CLOUD_ML_HP_METRIC_TAG": "accuracy"}
    hypertune.report_evaluation(100, loss=0.5, metrics={"accuracy": 0.8}, environ=env)
    (line,) = [json.loads(x) for x in open(tmp_path / "m")]
    assert line["accuracy"] == "0.8" and line["loss"] == "0.5"
    assert isinstance(line["timestamp"], float)
    assert not [k for k in line if k.endswith("/s")]  # no progress-line fields


@pytest.mark.parametrize("change,expected", [
    ({"resumePreviousJobId": "tune00"}, "cannot continue an earlier job's study"),
    ({"params": [{"parameterName": "momentum", "type": "DOUBLE", "minValue": 0.5,
                  "maxValue": 0.99, "scaleType": "UNIT_REVERSE_LOG_SCALE"}]},
     "Katib has no UNIT_REVERSE_LOG_SCALE"),
])
def test_tuning_katib_cannot_run_is_refused(change, expected):
    with pytest.raises(UsageError, match=expected):
        engine().check(tuning({**HP, **change}))


def test_experiment_is_created_read_and_deleted(api):
    eng = kubeflow.KubeflowEngine(EngineOptions(image=IMAGE))
    rendered = eng.render(tuning(), PACKAGE)
    api.route("POST", EXPERIMENTS, 201, lambda req: {**req.json(), "metadata": {
        **req.json()["metadata"], "uid": "u-9"}})
    handle = eng.create(rendered)
    assert handle["kind"] == "Experiment" and handle["uid"] == "u-9"
    assert api.requests[0].json() == rendered.body
    api.route("GET", EXPERIMENTS + "/tune01", 200, {
        "apiVersion": "kubeflow.org/v1beta1", "kind": "Experiment",
        "metadata": {"name": "tune01"},
        "status": {"conditions": [{"type": "Running", "status": "True"}]}})
    api.route("GET", PODS, 200, {"kind": "PodList", "items": []})
    assert eng.status(handle).state == records.RUNNING
    api.route("DELETE", EXPERIMENTS + "/tune01", 200, {"kind": "Status"})
    assert eng.cancel(handle) == records.CANCELLED
    assert api.requests[-1].method == "DELETE"
    api.route("POST", EXPERIMENTS, 404, {"message": "the server could not find the "
                                                    "requested resource"})
    with pytest.raises(SubmitError, match="no Experiment resource .* install Katib"):
        eng.create(rendered)


def test_jobs_update_patches_the_tfjobs_labels(api, capsys):
    """`jobs update` sends a JSON merge patch of the TFJob's labels (removed keys null,
    mljob's own untouched); a TFJob gone from the cluster leaves the record's change."""
    record = records.JobRecord("upd01", runner="kubeflow", labels={"team": "vision",
                                                                   "env": "dev"},
                               engine={"namespace": "team-a", "name": "upd01",
                                       "context": "edge", "kind": "TFJob"})
    record.set_state(records.RUNNING)
    records.save(record)
    api.route("PATCH", TFJOBS + "/upd01", 200, lambda req: req.json())
    status, out, err = cli(capsys, "jobs", "update", "upd01", "--update-labels",
                           "env=prod,owner=ana", "--remove-labels", "team")
    assert status == 0 and out == "Updated job [upd01].\n", err
    patch = api.requests[-1]
    assert patch.method == "PATCH" and patch.path == "/apis/kubeflow.org/v1/namespaces/" \
                                                     "team-a/tfjobs/upd01"
    assert patch.headers["content-type"] == "application/merge-patch+json"
    assert patch.json() == {"metadata": {"labels": {"team": None, "env": "prod",
                                                    "owner": "ana"}}}
    assert records.load("upd01").labels == {"env": "prod", "owner": "ana"}

    api.route("PATCH", TFJOBS + "/upd01", 404, {"message": "not found"})
    status, out, err = cli(capsys, "jobs", "update", "upd01", "--clear-labels")
    assert status == 0 and "is gone from namespace team-a" in err
    assert api.requests[-1].json() == {"metadata": {"labels": {"env": None, "owner": None}}}
    assert records.load("upd01").labels == {}
    api.route("PATCH", TFJOBS + "/upd01", 403, {"message": "forbidden"})
    status, out, err = cli(capsys, "jobs", "update", "upd01", "--update-labels", "a=b")
    assert status == 1 and "check your kubeconfig's credentials" in err
    assert records.load("upd01").labels == {}  # refused: nothing changed
