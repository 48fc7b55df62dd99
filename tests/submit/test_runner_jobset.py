"""`--runner kubeflow --api jobset`: the JobSet we render (golden copies; the CRD schema
is tests/submit/test_engine_schemas.py), the TF_CONFIG each pod gets once the kubelet
has substituted its Job index, the restart and success policies, Kueue's queue, and the
kubernetes client's calls (create, status, logs, cancel) over HTTP to the recording
endpoint of tests/submit/test_runner_kubeflow.py.

Goldens: `MLJOB_UPDATE_GOLDEN=1 python -m pytest tests/submit/test_runner_jobset.py`
rewrites tests/golden/jobset_*.yaml after a deliberate change; review the diff.
"""
from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from tests.support.specs import resolve as spec_of
from submit import jobs as records
from submit.errors import SubmitError, UsageError
from submit.runners import get as get_runner
from submit.runners.engine import EngineOptions
from tests.submit.test_runner_kubeflow import (  # noqa: F401 - api is a fixture
    CASES, CUSTOM, GOLDEN, IMAGE, PACKAGE, PODS, api, cli, resolve, sdk_round_trip)

kubeflow = pytest.importorskip("submit.runners.kubeflow")
from submit.runners import kubeflow_jobset  # noqa: E402

JOBSETS = r"/apis/jobset.x-k8s.io/v1alpha2/namespaces/team-a/jobsets"


def engine(**options) -> kubeflow.KubeflowEngine:
    options.setdefault("image", IMAGE)
    return kubeflow.KubeflowEngine(EngineOptions(api="jobset", **options))


def render(spec, **options) -> dict:
    eng = engine(namespace="ml", **options)
    eng.check(spec)
    return eng.render(spec, PACKAGE).body


def jobs_of(body) -> dict[str, dict]:
    return {r["name"]: r for r in body["spec"]["replicatedJobs"]}


def container(rjob: dict) -> dict:
    (out,) = rjob["template"]["spec"]["template"]["spec"]["containers"]
    return out


def kubelet_env(rjob: dict, job_index: int) -> dict[str, str]:
    """The container's environment as the kubelet makes it for the pod of Job
    `job_index`: the downward API's label value, then `$(VAR)` of earlier variables
    substituted and `$$` made `$` (Kubernetes' expansion rules)."""
    env: dict[str, str] = {}
    for item in container(rjob)["env"]:
        if "valueFrom" in item:
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            assert path == f"metadata.labels['{kubeflow_jobset.JOB_INDEX_LABEL}']"
            env[item["name"]] = str(job_index)
            continue
        env[item["name"]] = re.sub(
            r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
            lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
            item["value"])
    return env


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_jobset_matches_golden(case):
    rendered = engine(namespace="ml-team").render(resolve(case), PACKAGE)
    path = os.path.join(GOLDEN, f"jobset_{case}.yaml")
    if os.environ.get("MLJOB_UPDATE_GOLDEN"):
        with open(path, "w") as f:
            f.write(rendered.text)
    with open(path) as f:
        assert rendered.text == f.read(), f"rendered JobSet differs from {path}"
    assert yaml.safe_load(rendered.text) == rendered.body
    assert rendered.handle["kind"] == "JobSet"


def test_every_pod_gets_tf_config_naming_the_stable_hosts_and_its_own_index():
    body = render(resolve("standard_1"))
    assert body["spec"]["network"] == {"enableDNSHostnames": True, "subdomain": "job01",
                                       "publishNotReadyAddresses": True}
    rjobs = jobs_of(body)
    assert {n: r["replicas"] for n, r in rjobs.items()} == {"chief": 1, "worker": 4,
                                                            "ps": 3}
    cluster = {"chief": ["job01-chief-0-0.job01:2222"],
               "worker": [f"job01-worker-{i}-0.job01:2222" for i in range(4)],
               "ps": [f"job01-ps-{i}-0.job01:2222" for i in range(3)]}
    for name, rjob in rjobs.items():
        job = rjob["template"]["spec"]
        assert (job["completionMode"], job["completions"], job["parallelism"]) == \
            ("Indexed", 1, 1)  # one pod per Job: its host is <jobset>-<rjob>-<i>-0
        assert container(rjob)["ports"] == [{"name": "tf-grpc", "containerPort": 2222}]
        for index in range(rjob["replicas"]):
            tf_config = json.loads(kubelet_env(rjob, index)["TF_CONFIG"])
            assert tf_config["cluster"] == cluster
            assert tf_config["task"] == {"type": name, "index": index}
            assert tf_config["environment"] == "cloud"
            assert tf_config["job"]["scaleTier"] == "STANDARD_1"


def test_master_evaluator_and_dollar_signs():
    """Cloud ML's legacy `master`, an evaluator outside the cluster, and a `$(` in the
    user's args left as it is by the kubelet."""
    spec = spec_of("job01", {**CUSTOM, "args": ["--note", "$(HOME) $$ $x"]},
                         job_dir="gs://mljob-test/jobs/job01",
                         staging_bucket="gs://mljob-staging")
    rjobs = jobs_of(render(spec))
    assert list(rjobs) == ["master", "worker", "ps", "evaluator"]
    evaluator = json.loads(kubelet_env(rjobs["evaluator"], 0)["TF_CONFIG"])
    assert set(evaluator["cluster"]) == {"master", "worker", "ps"}
    assert evaluator["task"] == {"type": "evaluator", "index": 0}
    assert evaluator["job"]["args"] == ["--note", "$(HOME) $$ $x"]
    master = json.loads(kubelet_env(rjobs["master"], 0)["TF_CONFIG"])
    assert master["cluster"]["master"] == ["job01-master-0-0.job01:2222"]


def test_success_on_the_chief_and_restarts_per_replica():
    body = render(resolve("custom_evaluator"))
    assert body["spec"]["successPolicy"] == {"operator": "All",
                                             "targetReplicatedJobs": ["master"]}
    assert body["spec"]["failurePolicy"] == {"maxRestarts": 0, "rules": [
        {"name": "ReplicaOutOfRestarts", "action": "FailJobSet"}]}
    rjobs = jobs_of(body)
    policy = {n: (r["template"]["spec"]["backoffLimit"],
                  r["template"]["spec"]["template"]["spec"]["restartPolicy"],
                  "podFailurePolicy" in r["template"]["spec"]) for n, r in rjobs.items()}
    # master Never; worker ExitCode 3; ps OnFailure 5; evaluator Never
    assert policy == {"master": (0, "Never", False), "worker": (3, "Never", True),
                      "ps": (5, "OnFailure", False), "evaluator": (0, "Never", False)}
    (rule,) = rjobs["worker"]["template"]["spec"]["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["operator"] == "In"
    assert rule["onExitCodes"]["values"] == list(range(1, 128))  # 128+: signals, retried
    assert rule["onExitCodes"]["containerName"] == "tensorflow"
    grace = rjobs["evaluator"]["template"]["spec"]["template"]["spec"]
    assert grace["terminationGracePeriodSeconds"] == 90


def test_queue_ttl_deadline_spot_and_service_account_from_the_config():
    ti = {**CUSTOM, "serviceAccount": "trainer",
          "scheduling": {"queueName": "team-q", "ttlAfterFinished": "3600.5s",
                         "maxRunningTime": "7200s", "strategy": "SPOT"}}
    spec = spec_of("job01", ti, job_dir="gs://mljob-test/jobs/job01",
                         staging_bucket="gs://mljob-staging")
    body = render(spec)
    assert body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-q"
    assert body["spec"]["suspend"] is True and body["spec"]["ttlSecondsAfterFinished"] == 3601
    for rjob in body["spec"]["replicatedJobs"]:  # the queue is the JobSet's alone
        assert "kueue.x-k8s.io/queue-name" not in rjob["template"]["metadata"]["labels"]
        assert rjob["template"]["spec"]["activeDeadlineSeconds"] == 7200
        pod = rjob["template"]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "trainer"
        assert pod["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    flag = render(spec, queue="other-q", service_account="sa2")
    assert flag["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "other-q"
    pod = flag["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "sa2"
    plain = render(resolve("standard_1"))
    assert "suspend" not in plain["spec"] and "ttlSecondsAfterFinished" not in plain["spec"]
    # the TFJob takes the same keys in its runPolicy
    tfjob = kubeflow.KubeflowEngine(EngineOptions(image=IMAGE, namespace="ml")).render(
        spec, PACKAGE).body
    assert tfjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-q"
    assert sdk_round_trip(tfjob) == tfjob  # the training SDK's RunPolicy has both fields
    assert {k: tfjob["spec"]["runPolicy"][k] for k in ("suspend", "ttlSecondsAfterFinished",
                                                       "activeDeadlineSeconds")} == \
        {"suspend": True, "ttlSecondsAfterFinished": 3601, "activeDeadlineSeconds": 7200}


@pytest.mark.parametrize("change,options,expected", [
    ({"scheduling": {"maxWaitTime": "60s"}}, {}, "a JobSet has no wait limit"),
    ({"hyperparameters": {"goal": "MAXIMIZE", "hyperparameterMetricTag": "a",
                          "maxTrials": 2, "params": [{"parameterName": "x",
                                                      "type": "INTEGER", "minValue": 1,
                                                      "maxValue": 2}]}}, {},
     "submit it with --api tfjob"),
    ({"scheduling": {"strategy": "FLEX_START"}}, {}, "FLEX_START is Vertex AI's"),
    ({"network": "projects/1/global/networks/vpc"}, {}, "trainingInput.network is for "
     "--runner vertex"),
    ({"serviceAccount": "me@p.iam.gserviceaccount.com"}, {},
     "trainingInput.serviceAccount 'me@p.iam.gserviceaccount.com' is not a Kubernetes"),
    ({}, {"queue": "Team_Q"}, "--queue 'Team_Q' is not a queue name"),
    ({"workerCount": 10000, "scaleTier": "CUSTOM", "masterType": "standard"}, {},
     "is too long for a JobSet of 10000 worker replicas"),
])
def test_what_a_jobset_cannot_take_is_one_line_with_the_fix(change, options, expected):
    spec = spec_of("a_rather_long_job_id_of_47_characters_abcdefgh", change,
                         job_dir="gs://mljob-test/jobs/j",
                         staging_bucket="gs://mljob-staging") \
        if "workerCount" in change else \
        spec_of("job01", change, job_dir="gs://mljob-test/jobs/j",
                      staging_bucket="gs://mljob-staging")
    with pytest.raises(UsageError, match=re.escape(expected)) as info:
        engine(**options).check(spec)
    assert "\n" not in str(info.value)


def test_config_keys_are_checked_where_they_are_read():
    for ti, words in (({"scheduling": {"queueName": "Q"}}, "is not a queue name"),
                      ({"scheduling": {"ttlAfterFinished": "1h"}}, "is not a duration"),
                      ({"scheduling": {"strategy": "CHEAP"}}, "STANDARD, SPOT, FLEX_START"),
                      ({"scheduling": {"queue": "q"}}, "scheduling has unknown key 'queue'"),
                      ({"enableWebAccess": "yes"}, "enableWebAccess must be true or false")):
        with pytest.raises(UsageError, match=re.escape(words)):
            spec_of("job01", ti, job_dir="gs://mljob-test/j",
                          staging_bucket="gs://mljob-staging")


# --- the kubernetes client against the recording endpoint ------------------------------

def jobset_pod(rjob: str, index: int, phase: str, exit_code=None, restarts=0) -> dict:
    state = {"terminated": {"exitCode": exit_code}} if exit_code is not None else \
        {"running": {"startedAt": "2026-11-22T10:00:00Z"}}
    return {"metadata": {"name": f"job01-{rjob}-{index}-0-x7k2q", "uid": f"{rjob}{index}",
                         "labels": {kubeflow_jobset.JOBSET_NAME_LABEL: "job01",
                                    kubeflow_jobset.RJOB_LABEL: rjob,
                                    kubeflow_jobset.JOB_INDEX_LABEL: str(index)}},
            "status": {"phase": phase, "containerStatuses": [{
                "name": "tensorflow", "restartCount": restarts, "state": state,
                "ready": phase == "Running", "image": IMAGE, "imageID": "",
                "started": phase == "Running"}]}}


def jobset(*conditions, message="", ready=0, active=0, suspend=False) -> dict:
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "job01", "namespace": "team-a", "uid": "u-9"},
            "spec": {"suspend": suspend},
            "status": {"conditions": [{"type": c, "status": "True", "message": message,
                                       "reason": c + "Reason"} for c in conditions],
                       "replicatedJobsStatus": [{"name": "worker", "ready": ready,
                                                 "active": active, "succeeded": 0,
                                                 "failed": 0, "suspended": 0}]}}


HANDLE = {"name": "job01", "namespace": "team-a", "context": "edge", "kind": "JobSet"}


def test_create_posts_the_jobset_and_names_what_is_missing(api):
    eng = engine()
    rendered = eng.render(resolve("standard_1"), PACKAGE)
    api.route("POST", JOBSETS, 201, lambda req: {**req.json(), "metadata": {
        **req.json()["metadata"], "uid": "u-9"}})
    handle = eng.create(rendered)
    (request,) = api.requests
    assert request.path == JOBSETS and request.json() == rendered.body
    assert request.headers["authorization"] == "Bearer t0ken"
    assert handle == {**HANDLE, "uid": "u-9"}
    api.route("POST", JOBSETS, 404, {"message": "the server could not find the resource"})
    with pytest.raises(SubmitError, match=r"no JobSet resource \(jobset.x-k8s.io/v1alpha2\)"
                       r"; install JobSet"):
        eng.create(rendered)
    api.route("POST", JOBSETS, 409, {"message": "exists"})
    with pytest.raises(SubmitError, match="a JobSet named job01 already exists"):
        eng.create(rendered)


@pytest.mark.parametrize("body,state,message", [
    (jobset(suspend=True), records.QUEUED, None),
    (jobset("Suspended"), records.QUEUED, None),
    (jobset(active=2), records.PREPARING, None),
    (jobset(ready=1, active=2), records.RUNNING, None),
    (jobset("Completed"), records.SUCCEEDED, None),
    (jobset("Failed", message="jobset failed: worker out of restarts"), records.FAILED,
     "jobset failed: worker out of restarts"),
])
def test_status_maps_the_jobset_and_its_pods(api, body, state, message):
    api.route("GET", JOBSETS + "/job01", 200, body)
    api.route("GET", PODS, 200, {"items": [
        jobset_pod("worker", 1, "Running", restarts=2), jobset_pod("chief", 0, "Running"),
        jobset_pod("ps", 0, "Failed", exit_code=137)]})
    status = get_runner("kubeflow")(EngineOptions()).status(HANDLE)
    assert (status.state, status.message) == (state, message)
    assert [(r.label, r.state, r.exit_code, r.restarts) for r in status.replicas] == [
        ("master-replica-0", "RUNNING", None, 0), ("ps-replica-0", "FAILED", 137, 0),
        ("worker-replica-1", "RUNNING", None, 2)]
    assert api.requests[-1].query["labelSelector"] == ["jobset.sigs.k8s.io/jobset-name=job01"]


def test_logs_and_cancel_of_a_jobset(api):
    api.route("GET", JOBSETS + "/job01", 200, jobset("Completed"))
    api.route("GET", PODS, 200, {"items": [jobset_pod("chief", 0, "Succeeded", 0),
                                           jobset_pod("worker", 0, "Running")]})
    api.route("GET", PODS + "/job01-chief-0-0-x7k2q/log", 200,
              "2026-11-22T10:00:01Z training finished: step=10\n", "text/plain")
    api.route("GET", PODS + "/job01-worker-0-0-x7k2q/log", 200,
              "2026-11-22T10:00:02Z serving worker 0\n", "text/plain")
    eng = get_runner("kubeflow")(EngineOptions())
    lines = sorted(line.split("\t", 2)[2] for line in eng.logs(HANDLE, follow=True))
    assert lines == ["master-replica-0\ttraining finished: step=10",
                     "worker-replica-0\tserving worker 0"]
    api.route("DELETE", JOBSETS + "/job01", 200, {"kind": "Status", "status": "Success"})
    assert eng.cancel(HANDLE) == records.CANCELLED
    assert (api.requests[-1].method, api.requests[-1].path) == ("DELETE", JOBSETS + "/job01")
    assert api.requests[-1].query["propagationPolicy"] == ["Foreground"]


def test_cli_submit_describe_and_cancel_a_jobset(api, capsys, gcs_emulator):
    """The flags reach the engine and the record keeps the kind. A custom container, so
    that no package is built or staged (the package's path is the TFJob's CLI test)."""
    job_dir = "gs://mljob-test/kf/js01"
    api.route("POST", JOBSETS, 201, lambda req: req.json())
    status, out, err = cli(capsys, "js01", "--runner", "kubeflow", "--api", "JobSet",
                           "--queue", "team-q", "--job-dir", job_dir, "--master-image-uri",
                           IMAGE, "--async", "--", "--model", "mlp")
    assert status == 0, err
    body = api.requests[-1].json()
    assert body["kind"] == "JobSet" and body["spec"]["suspend"] is True
    assert container(body["spec"]["replicatedJobs"][0])["image"] == IMAGE
    assert body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-q"
    assert records.load("js01").engine["kind"] == "JobSet"
    api.route("GET", JOBSETS + "/js01", 200, jobset(ready=1))
    api.route("GET", PODS, 200, {"items": [jobset_pod("chief", 0, "Running")]})
    status, out, err = cli(capsys, "jobs", "describe", "js01")
    assert status == 0 and "state: RUNNING" in out, err
    api.route("DELETE", JOBSETS + "/js01", 200, {"kind": "Status", "status": "Success"})
    status, out, err = cli(capsys, "jobs", "cancel", "js01")
    assert status == 0 and "Job [js01] CANCELLED." in out


@pytest.mark.parametrize("argv,expected", [
    (["--runner", "vertex", "--api", "jobset"], "--api is for --runner kubeflow"),
    (["--runner", "local", "--queue", "q"], "--queue is for --runner kubeflow"),
    (["--runner", "kubeflow", "--api", "pytorchjob"], "Invalid value for '--api'"),
])
def test_cli_flags_for_another_runner_are_refused(capsys, argv, expected):
    status, out, err = cli(capsys, "job01", "--job-dir", "gs://mljob-test/kf/job01",
                           *argv, "--dry-run")
    assert status == 2 and expected in err
