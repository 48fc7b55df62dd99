"""One machine catalogue: the local GPU check, Kubeflow's resources and Vertex AI's
machine specs read the same GPU count for every machine name."""
from __future__ import annotations

import pytest

from mljob import machines
from submit.jobdef import spec as specs
from submit.packaging.package import Package
from submit.runners import kubeflow, vertex
from submit.runners.engine import EngineOptions

PACKAGE = Package(file_name="mljob-0.1.0.tar.gz", sha256="0" * 64, top_dir="mljob-0.1.0",
                  url="gs://mljob-test/packages/mljob-0.1.0.tar.gz")
NAMES = [*machines.LEGACY_NAMES, "n1-standard-4", "n1-highmem-16", "n1-highcpu-96"]


def resolve(machine: str) -> specs.JobSpec:
    return specs.resolve(specs.Flags("job01", job_dir="gs://mljob-test/jobs/job01"),
                         specs.training_config({"scaleTier": "CUSTOM", "masterType": machine,
                                                "workerType": machine, "workerCount": 1}))


@pytest.mark.parametrize("machine", NAMES)
def test_every_machine_has_one_gpu_count_everywhere(machine):
    expected = machines.lookup(machine).gpus
    spec = resolve(machine)
    assert [g.gpus for g in spec.groups] == [expected, expected]  # the local check's
    tfjob = kubeflow.KubeflowEngine(EngineOptions(namespace="ml")).render(spec, PACKAGE)
    for replica in tfjob.body["spec"]["tfReplicaSpecs"].values():
        limits = replica["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert int(limits.get("nvidia.com/gpu", 0)) == expected
    request = vertex.VertexEngine(EngineOptions(project="my-project-123")).render(
        spec, PACKAGE)
    for pool in request.body["customJob"]["jobSpec"]["workerPoolSpecs"]:
        assert pool["machineSpec"].get("acceleratorCount", 0) == expected
        assert pool["machineSpec"]["machineType"] == machines.lookup(machine).gce_type


def test_complex_model_m_gpu_is_four_gpus():
    assert machines.gpus("complex_model_m_gpu") == 4
    assert resolve("complex_model_m_gpu").gpus_needed == 4


@pytest.mark.parametrize("name", ["n1-standard-0", "n1-standard-97", "n1-ultramem-8",
                                  "n1-standard-4\n", "n1-standard-٤", "gigantic"])
def test_unknown_machine_names_are_refused(name):
    assert not machines.is_known(name)
    with pytest.raises(KeyError):
        machines.lookup(name)
