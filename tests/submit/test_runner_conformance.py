"""One conformance suite for every runner: the same tests of the six verbs (`check`,
`render`, `create`, `status`, `logs`, `cancel`) and of the job life on top of them
(`submit.lifecycle`): a job that succeeds, one that fails, one that is cancelled.

The local runner runs for real: a detached supervisor process and one replica process
of a tiny user package, whose trainer args say how it ends. The cluster engines run
their real clients (kubernetes, google-cloud-aiplatform) over HTTP against a recording
endpoint on 127.0.0.1 (`tests.support.api_edge`), scripted per job to answer as the
engine's API documents for the same three endings. Ray runs for real: a Ray head
started once for the module (`ray start --head`, 2 logical CPUs, stopped by PID), the
same tiny package built and staged once, each job a Ray job; those cases are slow (the
head's start and each Ray job's start cost seconds).

A runner joins the suite by one line in `FARS` (a harness: its runner, a job spec, a
job it refuses, and the far side of its verbs); `test_every_runner_is_in_the_suite`
fails until it does.

A batch prediction job is one more kind of job of the same life: every runner the
registry says takes one (`runners.PREDICTION`) runs one through the same verbs and
`lifecycle` (`prediction_spec`: the harness's batch prediction job, ending as asked),
and every other runner refuses one in a line naming those that do. On the local runner
the job is real: worker processes (`python -m predict.batch_worker`) over an export,
a real one (built once for the module, slow) for the job that succeeds, an export that
cannot load for the job that fails.
"""
from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import pytest
import yaml

from mljob import procs, storage
from tests.support.specs import resolve as spec_of
from submit import jobs as records, lifecycle, runners
from submit.jobdef import spec as specs
from submit.errors import JobCancelled, JobFailed, JobNotFoundError, UsageError
from submit.packaging.package import Package
from submit.prediction import spec as prediction_specs
from submit.prediction.spec import PredictionSpec
from submit.runners.engine import EngineOptions, Runner
from tests.support import ray_cluster
from tests.support.api_edge import ApiEdge
from tests.support.submit_cli import write_package

HELLO = "conformance says hello"
TASK = f"""import sys, time
print({HELLO!r}, flush=True)
if "fail" in sys.argv:
    print("giving up", file=sys.stderr, flush=True)
    sys.exit(3)
if "hang" in sys.argv:
    time.sleep(120)
"""
SHA = "0" * 64
PACKAGE = Package(file_name="fakejob-0.1.tar.gz", sha256=SHA, top_dir="fakejob-0.1",
                  url=f"gs://mljob-test/staging/{SHA}/fakejob-0.1.tar.gz")
IMAGE = "registry.example.com/ml/fakejob:0.1"
WAIT_S = 60.0


class Far:
    """A runner and the far side of its verbs, for jobs that end as their args say:
    `succeed`, `fail` or `hang` (until cancelled)."""

    package: Package | None = PACKAGE
    job_dirs_on_gcs = False  # its job records go to gs:// (the GCS emulator)
    fixtures: tuple[str, ...] = ()  # pytest fixtures its constructor takes, by name
    marks: tuple = ()  # pytest marks of its cases

    def runner(self) -> Runner:
        raise NotImplementedError

    def spec(self, job_id: str, ending: str) -> specs.JobSpec:
        raise NotImplementedError

    def refused(self) -> specs.JobSpec:
        """A job this runner cannot run."""
        raise NotImplementedError

    def requests(self) -> list:
        """What reached the far side so far (an engine's API calls)."""
        return []

    def cancelled(self, job_id: str) -> bool:
        """Whether the far side was told to stop the job (and did)."""
        raise NotImplementedError

    def left_running(self, job_id: str) -> list[int]:
        """Processes of an ended job still running on this machine."""
        return []

    def close(self) -> None:
        pass

    prediction_marks: dict[str, tuple] = {}  # pytest marks of its batch prediction cases
    fixture = staticmethod(lambda name: None)  # the test's fixture of that name

    def prediction_runner(self) -> Runner:
        return self.runner()

    def prediction_spec(self, job_id: str, ending: str) -> PredictionSpec:
        """A batch prediction job that ends as `ending` says (`succeed`, `fail`, `hang`)."""
        raise NotImplementedError

    def prediction_cancelled(self, job_id: str) -> bool:
        return self.cancelled(job_id)


def prediction_of(job_id: str, inputs: str, output: str, model_dir: str,
                  region: str = "us-central1") -> PredictionSpec:
    return prediction_specs.resolve(job_id, model_dir=model_dir, input_paths=inputs,
                                    output_path=output, data_format="text",
                                    region=region, max_worker_count=1)


class LocalFar(Far):
    package = None

    def __init__(self, tmp_path, monkeypatch):
        self.tmp = tmp_path
        self.source = write_package(tmp_path / "pkg", TASK)

    def runner(self) -> Runner:
        return runners.get("local")(EngineOptions(), source_dir=self.source)

    def spec(self, job_id: str, ending: str) -> specs.JobSpec:
        return spec_of(job_id, {}, job_dir=str(self.tmp / job_id),
                             module_name="fakejob.task", args=[ending], staged=False)

    def refused(self) -> specs.JobSpec:
        return spec_of("many", {}, scale_tier="CUSTOM", worker_count=65,
                             parameter_server_count=1, job_dir=str(self.tmp / "many"),
                             module_name="fakejob.task", staged=False)

    def cancelled(self, job_id: str) -> bool:
        record = records.load(job_id)
        return bool(record.replicas) and self.left_running(job_id) == [] and \
            any(137 in r.exit_codes or 143 in r.exit_codes for r in record.replicas)

    def left_running(self, job_id: str) -> list[int]:
        record = records.load(job_id)
        wait_for(lambda: not record.supervisor_alive(), "the supervisor to exit")
        return [r.pid for r in record.replicas if r.pid and procs.pid_alive(r.pid)]

    prediction_marks = {"succeed": (pytest.mark.slow,)}  # a real export, built once

    def prediction_spec(self, job_id: str, ending: str) -> PredictionSpec:
        inputs = self.tmp / f"{job_id}-in"
        inputs.mkdir()
        (inputs / "a.json").write_text('{"image": [0.5], "key": 1}\n' * 3)
        if ending == "succeed":
            from tests.support.predict_models import images, instance_lines
            (inputs / "a.json").write_text(instance_lines(images(3, seed=1), keys=range(3)))
            export = self.fixture("conformance_export")
        else:  # an export that cannot load: the worker fails with status 2 once it
            export = str(self.tmp / f"{job_id}-export")  # has imported TensorFlow
            os.makedirs(export)
            with open(os.path.join(export, "saved_model.pb"), "wb") as f:
                f.write(b"not a SavedModel")
        return prediction_of(job_id, str(inputs / "*.json"), str(self.tmp / f"{job_id}-out"),
                             export)

    def prediction_cancelled(self, job_id: str) -> bool:
        record = records.load(job_id)
        return bool(record.replicas) and self.left_running(job_id) == [] and \
            all(r.exit_code in (137, 143) for r in record.replicas)

    def close(self) -> None:
        """Every supervisor a test started, stopped by its PID (with its group)."""
        for record in records.list_all():
            pid = record.supervisor_pid
            if pid and procs.pid_alive(pid):
                procs.signal_group(pid, signal.SIGTERM)
                deadline = time.monotonic() + 10
                while procs.pid_alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                procs.signal_group(pid, signal.SIGKILL)


class EdgeFar(Far):
    """A cluster engine's API on an ApiEdge, holding each job's ending and whether it
    was stopped."""

    job_dirs_on_gcs = True

    def __init__(self, tmp_path, monkeypatch):
        self.edge = ApiEdge().__enter__()
        self.endings: dict[str, str] = {}
        self.stopped: set[str] = set()

    def spec(self, job_id: str, ending: str) -> specs.JobSpec:
        self.endings[job_id] = ending
        return spec_of(job_id, {}, job_dir=f"gs://mljob-test/conf/{job_id}",
                             args=[ending])

    def refused(self) -> specs.JobSpec:
        return spec_of("here", {}, job_dir="/tmp/not-reachable-from-a-cluster")

    def requests(self) -> list:
        return list(self.edge.requests)

    def cancelled(self, job_id: str) -> bool:
        return job_id in self.stopped

    def close(self) -> None:
        self.edge.__exit__(None, None, None)

    def prediction_spec(self, job_id: str, ending: str) -> PredictionSpec:
        """Inputs and an export on gs:// (the GCS emulator), where the engine's workers
        read them."""
        self.endings[job_id] = ending
        base = f"gs://mljob-test/conf/{job_id}"
        storage.write_bytes(f"{base}/in/a.json", b'{"image": [0.5], "key": 1}\n')
        storage.write_bytes(f"{base}/model/saved_model.pb", b"")
        return prediction_of(job_id, f"{base}/in/*.json", f"{base}/out", f"{base}/model")


class KubeflowFar(EdgeFar):
    """The Kubernetes API of a cluster with the Training Operator, reached through a
    kubeconfig whose current context points at the edge."""

    TFJOBS = "/apis/kubeflow.org/v1/namespaces/team-a/tfjobs"
    PODS = "/api/v1/namespaces/team-a/pods"

    def __init__(self, tmp_path, monkeypatch):
        pytest.importorskip("submit.runners.kubeflow")
        super().__init__(tmp_path, monkeypatch)
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "edge",
                  "clusters": [{"name": "edge", "cluster": {"server": self.edge.url}}],
                  "users": [{"name": "me", "user": {"token": "t0ken"}}],
                  "contexts": [{"name": "edge", "context": {
                      "cluster": "edge", "user": "me", "namespace": "team-a"}}]}
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        monkeypatch.setenv("KUBECONFIG", str(path))
        self.edge.route("POST", self.TFJOBS, 201, lambda r: {**r.json(), "metadata": {
            **r.json()["metadata"], "uid": "u-" + r.json()["metadata"]["name"]}})
        self.edge.route("GET", self.TFJOBS + "/([a-z0-9-]+)", 200, self._tfjob)
        self.edge.route("DELETE", self.TFJOBS + "/([a-z0-9-]+)", 200, self._delete)
        self.edge.route("GET", self.PODS, 200, self._pods)
        self.edge.route("GET", self.PODS + "/([a-z0-9-]+)-chief-0/log", 200,
                        f"2026-11-22T10:00:01Z {HELLO}\n", "text/plain")
        self.edge.route("GET", self.PODS + "/([a-z0-9-]+)-0-x7k2p/log", 200,
                        f"2026-11-22T10:00:01Z {HELLO}\n", "text/plain")
        self.edge.route("POST", self.CONFIGMAPS, 201, lambda r: r.json())
        self.edge.route("DELETE", self.CONFIGMAPS + "/([a-z0-9-]+)-plan", 200,
                        {"kind": "Status", "status": "Success"})
        self.edge.route("POST", self.JOBS, 201, lambda r: {**r.json(), "metadata": {
            **r.json()["metadata"], "uid": "u-" + r.json()["metadata"]["name"]}})
        self.edge.route("GET", self.JOBS + "/([a-z0-9-]+)", 200, self._job)
        self.edge.route("DELETE", self.JOBS + "/([a-z0-9-]+)", 200, self._delete_job)

    CONFIGMAPS = "/api/v1/namespaces/team-a/configmaps"
    JOBS = "/apis/batch/v1/namespaces/team-a/jobs"

    def runner(self) -> Runner:
        return runners.get("kubeflow")(EngineOptions(image=IMAGE))

    def prediction_runner(self) -> Runner:
        return runners.get("kubeflow")(EngineOptions(image=IMAGE, namespace="team-a"))

    def _job(self, request):
        """A batch/v1 Job as Kubernetes reports it for each ending."""
        name = self._name(request)
        status = {"succeed": {"succeeded": 1, "conditions": [
                      {"type": "Complete", "status": "True"}]},
                  "fail": {"failed": 3, "conditions": [
                      {"type": "Failed", "status": "True", "reason": "FailedIndexes",
                       "message": "Job has failed indexes"}]},
                  "hang": {"active": 1}}[self.endings.get(name, "succeed")]
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
            "name": name, "namespace": "team-a", "uid": "u-" + name}, "status": status}

    def _delete_job(self, request):
        name = self._name(request)
        self.stopped.add(name)
        self.edge.route("GET", f"{self.JOBS}/{name}", 404, {
            "kind": "Status", "code": 404, "reason": "NotFound", "message": "not found"})
        return {"kind": "Status", "status": "Success"}

    def _batch_pods(self, name: str):
        """The Job's one pod (completion index 0), as the Job controller labels it."""
        phase, code = {"succeed": ("Succeeded", 0), "fail": ("Failed", 2),
                       "hang": ("Running", None)}[self.endings.get(name, "succeed")]
        if name in self.stopped:
            return {"items": []}
        state = {"terminated": {"exitCode": code}} if code is not None else \
            {"running": {"startedAt": "2026-11-22T10:00:00Z"}}
        return {"items": [{
            "metadata": {"name": f"{name}-0-x7k2p", "uid": f"p-{name}", "labels": {
                "job-name": name, "batch.kubernetes.io/job-completion-index": "0"}},
            "status": {"phase": phase, "containerStatuses": [{
                "name": "predict", "restartCount": 0, "state": state,
                "ready": phase == "Running", "image": IMAGE, "imageID": "",
                "started": phase == "Running"}]}}]}

    @staticmethod
    def _name(request) -> str:
        return request.path.rsplit("/", 1)[1]

    def _tfjob(self, request):
        name = self._name(request)
        ending = self.endings.get(name, "succeed")
        conditions = {"succeed": ["Created", "Running", "Succeeded"],
                      "fail": ["Created", "Running", "Failed"],
                      "hang": ["Created", "Running"]}[ending]
        return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
                "metadata": {"name": name, "namespace": "team-a", "uid": "u-" + name},
                "status": {"conditions": [
                    {"type": c, "status": "True",
                     "message": "chief exited with code 3" if c == "Failed" else ""}
                    for c in conditions]}}

    def _delete(self, request):
        name = self._name(request)
        self.stopped.add(name)
        self.edge.route("GET", f"{self.TFJOBS}/{name}", 404, {  # deleted: gone
            "kind": "Status", "code": 404, "reason": "NotFound", "message": "not found"})
        return {"kind": "Status", "status": "Success"}

    def _pods(self, request):
        key, name = request.query["labelSelector"][0].rsplit("=", 1)
        if key == "job-name":
            return self._batch_pods(name)
        ending = self.endings.get(name, "succeed")
        phase, code = {"succeed": ("Succeeded", 0), "fail": ("Failed", 3),
                       "hang": ("Running", None)}[ending]
        if name in self.stopped:
            return {"items": []}
        state = {"terminated": {"exitCode": code}} if code is not None else \
            {"running": {"startedAt": "2026-11-22T10:00:00Z"}}
        return {"items": [{
            "metadata": {"name": f"{name}-chief-0", "uid": f"p-{name}", "labels": {
                "training.kubeflow.org/job-name": name,
                "training.kubeflow.org/replica-type": "chief",
                "training.kubeflow.org/replica-index": "0"}},
            "status": {"phase": phase, "containerStatuses": [{
                "name": "tensorflow", "restartCount": 0, "state": state,
                "ready": phase == "Running", "image": IMAGE, "imageID": "",
                "started": phase == "Running"}]}}]}


class VertexFar(EdgeFar):
    """Vertex AI's JobService and Cloud Logging, both on the edge."""

    PARENT = "projects/mljob-test/locations/us-central1"

    def __init__(self, tmp_path, monkeypatch):
        vertex = pytest.importorskip("submit.runners.vertex")
        super().__init__(tmp_path, monkeypatch)
        for name in (*vertex.PROJECT_ENVS,):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
        monkeypatch.setenv(vertex.VERTEX_ENDPOINT_ENV, self.edge.url)
        monkeypatch.setenv(vertex.LOGGING_ENDPOINT_ENV, self.edge.url)
        self.ids: dict[str, str] = {}   # the CustomJob's numeric id -> the job id
        self.edge.route("POST", f"/v1/{self.PARENT}/customJobs", 200, self._create)
        self.edge.route("GET", "/v1/projects/1/locations/us-central1/customJobs/([0-9]+)",
                        200, self._job)
        self.edge.route("POST", "/v1/projects/1/locations/us-central1/customJobs/"
                        "([0-9]+):cancel", 200, self._cancel)
        self.edge.route("POST", "/v2/entries:list", 200, self._entries)
        self.edge.route("POST", f"/v1/{self.PARENT}/batchPredictionJobs", 200,
                        lambda r: self._create(r, "batchPredictionJobs"))
        self.edge.route("GET", "/v1/projects/1/locations/us-central1/batchPredictionJobs/"
                        "([0-9]+)", 200, lambda r: self._job(r, "batchPredictionJobs"))
        self.edge.route("POST", "/v1/projects/1/locations/us-central1/batchPredictionJobs/"
                        "([0-9]+):cancel", 200, self._cancel)

    def runner(self) -> Runner:
        runner = runners.get("vertex")(EngineOptions(project="mljob-test"))
        runner.poll_s = 0.05  # type: ignore[attr-defined]  # Cloud Logging's quota
        return runner

    def _create(self, request, kind: str = "customJobs"):
        job_id = request.json()["displayName"]
        number = str(7200000000000000000 + len(self.ids) + 1)
        self.ids[number] = job_id
        return {"name": self._path(number, kind), "displayName": job_id,
                "state": "JOB_STATE_QUEUED"}

    def _path(self, number: str, kind: str = "customJobs") -> str:
        return f"projects/1/locations/us-central1/{kind}/{number}"

    def _job(self, request, kind: str = "customJobs"):
        number = request.path.rsplit("/", 1)[1]
        job_id = self.ids[number]
        state = {"succeed": "JOB_STATE_SUCCEEDED", "fail": "JOB_STATE_FAILED",
                 "hang": "JOB_STATE_RUNNING"}[self.endings[job_id]]
        if job_id in self.stopped:
            state = "JOB_STATE_CANCELLED"
        job = {"name": self._path(number, kind), "displayName": job_id, "state": state}
        if kind == "batchPredictionJobs" and state == "JOB_STATE_SUCCEEDED":
            job.update(outputInfo={"gcsOutputDirectory": f"gs://mljob-test/conf/{job_id}/"
                                                         "out/prediction-1"},
                       completionStats={"successfulCount": "1", "failedCount": "0"},
                       resourcesConsumed={"replicaHours": 0.01})
        if state == "JOB_STATE_FAILED":
            job["error"] = {"code": 3, "message": "The replica workerpool0-0 exited with "
                                                  "a non-zero status of 3."}
        return job

    def _cancel(self, request):
        number = request.path.rsplit("/", 1)[1].split(":")[0]
        self.stopped.add(self.ids[number])
        return {}

    def _entries(self, request):
        number = request.json()["filter"].split('resource.labels.job_id="')[1][:19]
        return {"entries": [{
            "insertId": "id0001", "timestamp": "2026-03-01T12:00:01.000001Z",
            "severity": "INFO", "textPayload": HELLO,
            "resource": {"type": "ml_job", "labels": {
                "job_id": number, "task_name": "workerpool0-0",
                "project_id": "mljob-test"}}}]}


class RayFar(Far):
    """A real Ray head (module-scoped) and the tiny package, built and staged once."""

    fixtures = ("ray_conformance",)
    marks = (pytest.mark.slow,
             pytest.mark.skipif(ray_cluster.skip_reason() is not None,
                                reason=ray_cluster.skip_reason() or ""))

    def __init__(self, tmp_path, monkeypatch, ray_conformance):
        from ray.job_submission import JobSubmissionClient
        self.head, self.package = ray_conformance
        self.tmp = tmp_path
        self.client = JobSubmissionClient(self.head.dashboard)
        self.before = {j.submission_id for j in self.client.list_jobs()}

    def runner(self) -> Runner:
        return runners.get("ray")(EngineOptions(ray_address=self.head.dashboard))

    def spec(self, job_id: str, ending: str) -> specs.JobSpec:
        return spec_of(job_id, {"scaleTier": "CUSTOM", "masterType": "n1-standard-1"},
                       job_dir=str(self.tmp / job_id), module_name="fakejob.task",
                       args=[ending])

    def refused(self) -> specs.JobSpec:
        return spec_of("mem", {}, job_dir="memory://conformance/mem",
                       module_name="fakejob.task")

    def requests(self) -> list:
        """The Ray jobs submitted since the harness was made."""
        return [j.submission_id for j in self.client.list_jobs()
                if j.submission_id not in self.before]

    def cancelled(self, job_id: str) -> bool:
        from ray.job_submission import JobStatus
        submission_id = records.load(job_id).engine["submission_id"]
        return self.client.get_job_status(submission_id) == JobStatus.STOPPED

    def left_running(self, job_id: str) -> list[int]:
        deadline = time.monotonic() + 30  # the driver stops the replicas as it ends
        while ray_cluster.job_processes(job_id) and time.monotonic() < deadline:
            time.sleep(0.2)
        return ray_cluster.job_processes(job_id)


@pytest.fixture(scope="module")
def ray_conformance(tmp_path_factory):
    """A Ray head for the module, and the tiny package built and staged beside it."""
    from submit.packaging import package as packages
    folder = tmp_path_factory.mktemp("ray-conformance")
    built = packages.build(write_package(folder / "pkg", TASK), str(folder / "dist"))
    staged = packages.stage(built, str(folder / "staging" / built.sha256 /
                                       built.file_name))
    with ray_cluster.head(str(folder / "ray"), num_cpus=2) as node:
        yield node, staged


# One line per runner: its harness.
FARS: dict[str, type[Far]] = {"local": LocalFar, "kubeflow": KubeflowFar,
                              "vertex": VertexFar, "ray": RayFar}


@pytest.fixture(scope="module")
def conformance_export(tmp_path_factory) -> str:
    """A real SavedModel export, for the local runner's batch prediction job."""
    from tests.support.predict_models import saved_model_export
    return saved_model_export(str(tmp_path_factory.mktemp("conformance") / "export"))


def harness_of(name: str, request, tmp_path, monkeypatch) -> Iterator[Far]:
    kind = FARS[name]
    if kind.job_dirs_on_gcs:
        request.getfixturevalue("gcs_emulator")
    harness = kind(tmp_path, monkeypatch,  # type: ignore[call-arg]
                   **{name: request.getfixturevalue(name) for name in kind.fixtures})
    harness.fixture = request.getfixturevalue  # type: ignore[method-assign]
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture(params=[pytest.param(name, marks=FARS[name].marks)
                        for name in sorted(FARS)])
def far(request, tmp_path, monkeypatch) -> Iterator[Far]:
    yield from harness_of(request.param, request, tmp_path, monkeypatch)


def prediction_cases(ending: str) -> list:
    """Each runner that takes a batch prediction job, with its marks for this ending."""
    return [pytest.param(name, marks=(*FARS[name].marks,
                                      *FARS[name].prediction_marks.get(ending, ())))
            for name in sorted(runners.PREDICTION) if name in FARS]


def wait_for(check, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def started(far: Far, job_id: str, ending: str) -> tuple[Runner, records.JobRecord]:
    """A job checked, rendered and created detached (as --async), through the life."""
    runner = far.runner()
    spec = far.spec(job_id, ending)
    runner.check(spec)
    rendered = runner.render(spec, far.package)
    record = lifecycle.new_record(runner, spec, far.package, rendered)
    line = lifecycle.start(runner, rendered, record, attach=False)
    assert line == f"Job [{job_id}] submitted successfully to {runner.name}."
    return runner, record


def ended_state(runner: Runner, record: records.JobRecord) -> str:
    state = wait_for(lambda: (s := runner.status(lifecycle.handle(record)).state)
                     in records.FINAL_STATES and s, f"job {record.job_id} to end")
    return state


# --- the tests ----------------------------------------------------------------------

# Runners whose harness is still to come, and where their verbs are tested meanwhile.
PENDING: dict[str, str] = {}


def test_every_runner_is_in_the_suite():
    assert set(FARS) | set(PENDING) == set(runners.RUNNERS)
    assert not set(FARS) & set(PENDING)


def test_check_takes_a_job_and_refuses_one_it_cannot_run(far):
    runner = far.runner()
    runner.check(far.spec("ok01", "succeed"))
    with pytest.raises(UsageError) as info:
        runner.check(far.refused())
    assert "\n" not in str(info.value) and str(info.value)
    assert far.requests() == []


def test_render_is_the_job_object_and_starts_nothing(far):
    runner = far.runner()
    rendered = runner.render(far.spec("ok01", "succeed"), far.package)
    assert json.loads(json.dumps(rendered.body)) == rendered.body  # JSON-able
    assert json.loads(json.dumps(rendered.handle)) == rendered.handle
    assert "ok01" in rendered.text and rendered.blocked is None
    assert far.requests() == []  # no network
    with pytest.raises(JobNotFoundError):
        records.load("ok01")  # and no record


def test_a_job_that_succeeds(far):
    runner, record = started(far, "ok01", "succeed")
    saved = records.load("ok01")
    assert saved.runner == runner.name and saved.engine == record.engine
    assert json.loads(json.dumps(record.engine)) == record.engine
    assert ended_state(runner, record) == records.SUCCEEDED
    lines = list(runner.logs(lifecycle.handle(record), follow=True))
    assert any(line.split("\t")[2:] == ["master-replica-0", HELLO] for line in lines), \
        lines
    with pytest.raises(UsageError, match="--task-name 'chief-0' names no replica"):
        list(runner.logs(lifecycle.handle(record), task_name="chief-0", follow=False))
    record = lifecycle.refresh(runner, records.load("ok01"))
    assert record.state == records.SUCCEEDED and records.load("ok01").done
    assert lifecycle.ended(record) == 0
    with pytest.raises(UsageError, match="already ended SUCCEEDED"):
        lifecycle.cancel(runner, record)
    assert not far.cancelled("ok01") and far.left_running("ok01") == []


def test_a_job_that_fails(far):
    runner, record = started(far, "fail01", "fail")
    said: list[str] = []
    with pytest.raises(JobFailed) as info:
        lifecycle.follow(runner, record, said.append, task_name=None)
    assert said[-1] == "Job [fail01] FAILED."
    assert "status of 3" in str(info.value) or "code 3" in str(info.value), info.value
    assert records.load("fail01").state == records.FAILED


def test_a_job_that_is_cancelled(far):
    runner, record = started(far, "hang01", "hang")
    wait_for(lambda: runner.status(lifecycle.handle(record)).state == records.RUNNING,
             "the job to run")
    record = lifecycle.cancel(runner, records.load("hang01"))
    assert record.state in (records.CANCELLING, records.CANCELLED)
    assert far.cancelled("hang01")
    record = wait_for(lambda: (r := lifecycle.refresh(runner, records.load("hang01")))
                      .state == records.CANCELLED and r, "the job to be cancelled")
    with pytest.raises(JobCancelled):
        lifecycle.ended(record)
    with pytest.raises(UsageError, match="already ended CANCELLED"):
        lifecycle.cancel(runner, record)


# --- a batch prediction job: one more kind of job of the same life ----------------------

def started_prediction(far: Far, job_id: str, ending: str
                       ) -> tuple[Runner, records.JobRecord]:
    """A batch prediction job rendered and created detached (as --async), through the
    same life as a training job."""
    runner = far.prediction_runner()
    spec = far.prediction_spec(job_id, ending)
    rendered = runner.render_prediction(spec)
    assert json.loads(json.dumps(rendered.body)) == rendered.body
    assert job_id in rendered.text and far.requests() == []  # no network yet
    record = lifecycle.new_record(runner, spec, None, rendered)
    assert (record.mode, record.runner) == ("prediction", runner.name)
    assert record.prediction_input["outputPath"] == spec.output_path
    assert record.training_input == {} and record.job_dir is None
    line = lifecycle.start(runner, rendered, record, attach=False)
    assert line.startswith(f"Job [{job_id}] submitted successfully to {runner.name}")
    return runner, record


def test_every_runner_takes_a_batch_prediction_job_or_refuses_it_in_one_line(
        tmp_path, monkeypatch):
    """The runners the registry names run one (each has a harness here); any other
    refuses one in a line naming them, before anything is rendered."""
    assert set(runners.PREDICTION) <= set(FARS) | set(PENDING)
    for name in runners.PREDICTION:
        assert FARS[name].prediction_spec is not Far.prediction_spec, name

    class Plain(Runner):  # a runner of the six verbs only
        name = "plain"
        render = create = status = logs = cancel = None  # type: ignore[assignment]
    Plain.__abstractmethods__ = frozenset()
    with pytest.raises(UsageError) as info:
        Plain.__new__(Plain).render_prediction(
            prediction_of("p", "/in/*.json", "/out", "/model"))
    assert str(info.value) == ("--runner plain does not run batch prediction jobs; use "
                               "--runner local or vertex or kubeflow")


@pytest.mark.parametrize("name", prediction_cases("succeed"))
def test_a_batch_prediction_job_that_succeeds(name, request, tmp_path, monkeypatch):
    for far in harness_of(name, request, tmp_path, monkeypatch):
        runner, record = started_prediction(far, "pok01", "succeed")
        assert records.load("pok01").engine == record.engine
        assert ended_state(runner, record) == records.SUCCEEDED
        record = lifecycle.refresh(runner, records.load("pok01"))
        assert record.state == records.SUCCEEDED and record.mode == "prediction"
        assert record.prediction_output["outputPath"].startswith(
            record.prediction_input["outputPath"])
        if name in ("local", "vertex"):  # the engines that count predictions
            assert record.prediction_output["predictionCount"] in ("1", "3")
        lines = list(runner.logs(lifecycle.handle(record), follow=True))
        assert any(line.split("\t")[2:3] == ["worker-replica-0"] or HELLO in line
                   for line in lines), lines
        assert lifecycle.ended(record) == 0
        with pytest.raises(UsageError, match="already ended SUCCEEDED"):
            lifecycle.cancel(runner, record)
        assert not far.cancelled("pok01") and far.left_running("pok01") == []


@pytest.mark.parametrize("name", prediction_cases("fail"))
def test_a_batch_prediction_job_that_fails(name, request, tmp_path, monkeypatch):
    for far in harness_of(name, request, tmp_path, monkeypatch):
        runner, record = started_prediction(far, "pfail01", "fail")
        said: list[str] = []
        with pytest.raises(JobFailed) as info:
            lifecycle.follow(runner, record, said.append, task_name=None)
        assert said[-1] == "Job [pfail01] FAILED."
        assert ("status 2" in str(info.value) or "status of 3" in str(info.value)
                or "failed indexes" in str(info.value)), info.value
        assert records.load("pfail01").state == records.FAILED


@pytest.mark.parametrize("name", prediction_cases("hang"))
def test_a_batch_prediction_job_that_is_cancelled(name, request, tmp_path, monkeypatch):
    for far in harness_of(name, request, tmp_path, monkeypatch):
        runner, record = started_prediction(far, "phang01", "hang")
        wait_for(lambda: runner.status(lifecycle.handle(record)).state == records.RUNNING,
                 "the job to run")
        record = lifecycle.cancel(runner, records.load("phang01"))
        assert record.state in (records.CANCELLING, records.CANCELLED)
        record = wait_for(lambda: (r := lifecycle.refresh(runner, records.load("phang01")))
                          .state == records.CANCELLED and r, "the job to be cancelled")
        assert far.prediction_cancelled("phang01")
        with pytest.raises(JobCancelled):
            lifecycle.ended(record)
