"""One catalogue of machine types: Cloud ML's legacy names and Compute Engine's n1 types
mapped once onto what a replica gets (vCPUs, memory, GPUs and their type).

Every consumer reads this table: the local runner's GPU check (and each replica's
CUDA_VISIBLE_DEVICES), Kubeflow's resource requests and Vertex AI's machine specs. The
legacy names run on the Compute Engine machines Cloud ML used (`standard` is
n1-standard-4, `large_model` n1-highmem-8, ...). Google retired the Tesla K80, so the
`*_gpu` names get T4s, the inexpensive GPU every N1 region has; an N1 VM takes at most four
T4s, so `complex_model_l_gpu`'s eight K80s are four T4s here, on every runner.
"""
from __future__ import annotations

import dataclasses
import re

T4, P100, V100 = "NVIDIA_TESLA_T4", "NVIDIA_TESLA_P100", "NVIDIA_TESLA_V100"
RETIRED_ACCELERATORS = {"NVIDIA_TESLA_K80": T4}  # retired type -> its stand-in
N1_MEMORY_GIB_PER_VCPU = {"standard": 3.75, "highmem": 6.5, "highcpu": 0.9}
N1_MAX_VCPUS = 96
_N1 = re.compile(r"n1-(standard|highmem|highcpu)-([1-9][0-9]?)")


@dataclasses.dataclass(frozen=True)
class Machine:
    """What one replica of this machine type gets."""

    name: str
    gce_type: str               # the Compute Engine machine behind it
    vcpus: int
    memory_gib: float
    gpus: int = 0
    accelerator: str | None = None  # Vertex AI / Compute Engine accelerator type


def _legacy(name: str, gce_type: str, memory_gib: float, gpus: int = 0,
            accelerator: str | None = None) -> Machine:
    vcpus = int(gce_type.rsplit("-", 1)[1])
    return Machine(name, gce_type, vcpus, memory_gib, gpus, accelerator)


LEGACY = {m.name: m for m in (
    _legacy("standard", "n1-standard-4", 15),
    _legacy("large_model", "n1-highmem-8", 52),
    _legacy("complex_model_s", "n1-highcpu-8", 7.2),
    _legacy("complex_model_m", "n1-highcpu-16", 14.4),
    _legacy("complex_model_l", "n1-highcpu-32", 28.8),
    _legacy("standard_gpu", "n1-standard-8", 30, 1, T4),
    _legacy("complex_model_m_gpu", "n1-standard-16", 60, 4, T4),
    _legacy("complex_model_l_gpu", "n1-standard-32", 120, 4, T4),
    _legacy("standard_p100", "n1-standard-8", 30, 1, P100),
    _legacy("complex_model_m_p100", "n1-standard-16", 60, 4, P100),
    _legacy("standard_v100", "n1-standard-8", 30, 1, V100),
    _legacy("large_model_v100", "n1-highmem-8", 52, 1, V100),
    _legacy("complex_model_m_v100", "n1-standard-16", 60, 4, V100),
    _legacy("complex_model_l_v100", "n1-standard-32", 120, 8, V100),
)}
LEGACY_NAMES = tuple(LEGACY)


def is_known(name: str) -> bool:
    """A legacy name, or an n1 type with 1 to 96 vCPUs (`n1-standard-4`)."""
    if name in LEGACY:
        return True
    match = _N1.fullmatch(name)
    return match is not None and int(match[2]) <= N1_MAX_VCPUS


def lookup(name: str) -> Machine:
    """The catalogue's entry for a machine name; an n1 type has no GPUs of its own (an
    acceleratorConfig gives them). Raises KeyError for a name `is_known` refuses."""
    if name in LEGACY:
        return LEGACY[name]
    if not is_known(name):
        raise KeyError(name)
    match = _N1.fullmatch(name)
    assert match is not None  # is_known matched it
    family, vcpus = match.groups()
    return Machine(name, name, int(vcpus), round(int(vcpus) * N1_MEMORY_GIB_PER_VCPU[family], 2))


def gpus(name: str, accelerator_count: int = 0) -> int:
    """GPUs per replica: acceleratorConfig.count when given, else the machine's own."""
    return accelerator_count or lookup(name).gpus
