"""Trainer arguments reach the trainer as typed on Kubernetes, as on the local runner: a
rendered TFJob's, JobSet's and Katib trial's container strings, put through the
kubelet's own expansion rules (`tests/support/kubelet.py`), give back the user's args,
custom command and job id; `--w '$(CLOUD_ML_JOB_ID)'` was the job id on Kubernetes."""
from __future__ import annotations

import pytest

from tests.submit.test_runner_kubeflow import CUSTOM, IMAGE, PACKAGE
from tests.support import kubelet
from tests.support.specs import resolve

kubeflow = pytest.importorskip("submit.runners.kubeflow")
from submit.runners.engine import EngineOptions  # noqa: E402

ARGS = ["--w", "$(CLOUD_ML_JOB_ID)", "--x", "$$", "a$b", "$(", "$(HOME)", "$", "$(A)$(B",
        "$$(CLOUD_ML_JOB_ID)", "cost=$5"]


def test_the_kubelet_port_follows_kubernetes_rules():
    env = {"A": "1", "B": "2"}
    assert kubelet.expand("$(A)-$(B)-$(C)-$$-$$(A)-$(A-$", env) == "1-2-$(C)-$-$(A)-$(A-$"


def containers_of(body) -> list[dict]:
    if body["kind"] == "JobSet":
        return [r["template"]["spec"]["template"]["spec"]["containers"][0]
                for r in body["spec"]["replicatedJobs"]]
    if body["kind"] == "Experiment":
        body = body["spec"]["trialTemplate"]["trialSpec"]
    return [r["template"]["spec"]["containers"][0]
            for r in body["spec"]["tfReplicaSpecs"].values()]


@pytest.mark.parametrize("api", ["tfjob", "jobset"])
def test_trainer_args_reach_the_trainer_unexpanded(api):
    spec = resolve("job01", CUSTOM, args=ARGS, job_dir="gs://mljob-test/jobs/job01",
                   staging_bucket="gs://mljob-staging")
    engine = kubeflow.KubeflowEngine(EngineOptions(api=api, image=IMAGE, namespace="ml"))
    engine.check(spec)
    body = engine.render(spec, PACKAGE).body
    for container in containers_of(body):
        got = kubelet.started(container, {"MLJOB_REPLICA_INDEX": "0"})
        assert got["args"][:len(ARGS)] == ARGS
        assert got["env"]["CLOUD_ML_JOB_ID"] == "job01"


def test_a_custom_containers_command_and_args():
    custom = {"scaleTier": "CUSTOM", "masterType": "standard",
              "masterConfig": {"imageUri": "gcr.io/p/trainer:1",
                               "containerCommand": ["run", "$(HOME)", "$$"],
                               "containerArgs": ["--w", "$(CLOUD_ML_JOB_ID)"]}}
    spec = resolve("job01", custom, job_dir="gs://mljob-test/jobs/job01")
    engine = kubeflow.KubeflowEngine(EngineOptions(namespace="ml"))
    engine.check(spec)
    body = engine.render(spec, None).body
    (master,) = containers_of(body)
    got = kubelet.started(master)
    assert got["command"] == ["run", "$(HOME)", "$$"]
    assert got["args"] == ["--w", "$(CLOUD_ML_JOB_ID)"]
