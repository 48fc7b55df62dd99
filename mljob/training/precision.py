"""Which precision a job computes in, chosen by the hardware (no TensorFlow here).

`--mixed-precision auto` (the bundled trainer's default) computes in bfloat16 where the
hardware does bfloat16 arithmetic natively, float32 elsewhere:

- a CPU with AVX512_BF16 (`avx512_bf16` in /proc/cpuinfo's flags) or AMX
  (`amx_bf16`): oneDNN runs bfloat16 convolutions and matmuls at up to twice float32's
  rate there; without them TensorFlow emulates bfloat16 and it is slower than float32;
- a GPU of compute capability 8.0 or more (Ampere on), whose tensor cores take bfloat16.

Either way the variables, checkpoints and the export stay float32 (Keras's
`mixed_bfloat16` policy: float32 variables, bfloat16 compute); only the arithmetic of a
step changes. `resolve` decides once, from what it is given, and says why in one line.

What crosses the wire under ps with local steps (`wire_dtype`; RunConfig.ps_wire_dtype)
is chosen the same way: bfloat16 (half the bytes) where the CPU has AVX-512 (or
AVX-NE-CONVERT), which oneDNN's bfloat16 casts need; elsewhere float32: there
TensorFlow's oneDNN logs `oneDNN supports DT_BFLOAT16 only on platforms with AVX-512`
as an ERROR in every worker and falls back to Eigen's slower casts.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

AUTO, OFF, BFLOAT16 = "auto", "off", "mixed_bfloat16"
PRECISIONS = (AUTO, OFF, BFLOAT16)
# CPU flags (Linux's names) that mean native bfloat16 arithmetic.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
BF16_GPU_CAPABILITY = (8, 0)
# CPU flags with which oneDNN computes bfloat16 (TensorFlow's
# IsDataTypeSupportedByOneDNNOnThisCPU: AVX512F or AVX_NE_CONVERT).
ONEDNN_BF16_CPU_FLAGS = ("avx512f", "avx_ne_convert")
WIRE_FLOAT32, WIRE_BFLOAT16 = "float32", "bfloat16"
CPUINFO = "/proc/cpuinfo"


@dataclasses.dataclass(frozen=True)
class Choice:
    """The precision a job computes in, and why (for its one log line)."""

    requested: str
    policy: str      # OFF or BFLOAT16
    reason: str

    def line(self) -> str:
        compute = "bfloat16" if self.policy == BFLOAT16 else "float32"
        return (f"mixed precision: {self.policy} ({compute} compute, float32 variables; "
                f"{self.reason})")


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags: the first `flags` line of /proc/cpuinfo (or of the text
    given). Empty where there is none (not Linux, an unreadable file)."""
    if cpuinfo is None:
        try:
            with open(CPUINFO, errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def resolve(requested: str, *, flags: Iterable[str] | None = None,
            gpu_capabilities: Sequence[tuple[int, int]] = ()) -> Choice:
    """The precision for `requested` (one of PRECISIONS): OFF and BFLOAT16 as asked,
    AUTO by the hardware. flags: the CPU's (None: read from /proc/cpuinfo);
    gpu_capabilities: the compute capabilities of the GPUs the job trains on (a job on
    GPUs computes where they are, so they decide)."""
    if requested not in PRECISIONS:
        raise ValueError(f"unknown precision {requested!r}; use one of "
                         f"{', '.join(PRECISIONS)}")
    if requested != AUTO:
        return Choice(requested, requested, "as asked")
    if gpu_capabilities:
        if all(tuple(c) >= BF16_GPU_CAPABILITY for c in gpu_capabilities):
            return Choice(AUTO, BFLOAT16, "auto: every GPU has compute capability "
                          f"{BF16_GPU_CAPABILITY[0]}.{BF16_GPU_CAPABILITY[1]} or more")
        return Choice(AUTO, OFF, "auto: a GPU without native bfloat16 (compute "
                      "capability under 8.0)")
    have = cpu_flags() if flags is None else frozenset(flags)
    native = [f for f in BF16_CPU_FLAGS if f in have]
    if native:
        return Choice(AUTO, BFLOAT16, f"auto: the CPU has {' and '.join(native)}")
    return Choice(AUTO, OFF, "auto: the CPU has no avx512_bf16 or amx_bf16")


@dataclasses.dataclass(frozen=True)
class Wire:
    """What crosses the wire between workers and ps under local steps, and why."""

    dtype: str       # WIRE_FLOAT32 or WIRE_BFLOAT16
    reason: str


def wire_dtype(requested: str | None, local_steps: bool, *,
               flags: Iterable[str] | None = None) -> Wire:
    """The wire's dtype: `requested` (RunConfig.ps_wire_dtype) as asked; unset, float32
    without local steps, and with them bfloat16 where the CPU has what oneDNN's bfloat16
    needs (ONEDNN_BF16_CPU_FLAGS), float32 elsewhere. flags: the CPU's (None: read from
    /proc/cpuinfo)."""
    if requested is not None:
        return Wire(requested, "as asked")
    if not local_steps:
        return Wire(WIRE_FLOAT32, "step by step")
    have = cpu_flags() if flags is None else frozenset(flags)
    native = [f for f in ONEDNN_BF16_CPU_FLAGS if f in have]
    if native:
        return Wire(WIRE_BFLOAT16, f"auto: the CPU has {native[0]}")
    return Wire(WIRE_FLOAT32, "auto: the CPU has no AVX-512, which oneDNN's bfloat16 needs")


__all__ = ["AUTO", "OFF", "BFLOAT16", "PRECISIONS", "BF16_CPU_FLAGS", "Choice",
           "ONEDNN_BF16_CPU_FLAGS", "Wire", "cpu_flags", "resolve", "wire_dtype"]
