"""Which CPU kernels TensorFlow computes with, chosen by the hardware (no TensorFlow here).

TensorFlow's Linux x86-64 build carries two sets of CPU kernels for convolutions,
matmuls and their gradients: its own (Eigen's) and oneDNN's. It turns oneDNN on by
itself only where the CPU has AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX, and reads
TF_ENABLE_ONEDNN_OPTS once, when it first needs to know. On a CPU with AVX2 and FMA
alone it keeps Eigen's, although oneDNN's float32 matmul runs there at 1.8x Eigen's and
the bundled CNN trains 1.35x faster with it (bench/README.md, section 10).

`choose()`, run when `mljob.training` is imported (before TensorFlow, as that module
asks), turns oneDNN on for such a CPU by setting TF_ENABLE_ONEDNN_OPTS=1 in the
process's environment (and MLJOB_ONEDNN_CHOSEN=1 beside it), so the processes it starts
inherit the choice and report it as such. A TF_ENABLE_ONEDNN_OPTS the user set is kept as
it is (`TF_ENABLE_ONEDNN_OPTS=0` keeps Eigen's kernels); where TensorFlow was imported
first, nothing is changed and the line says so. `choose_once()` decides once per process
and gives the same Choice (kept in `CHOSEN`) to the chief's one log line.
"""
from __future__ import annotations

import dataclasses
import os
import platform
import sys
from collections.abc import Iterable, MutableMapping

from mljob.training.precision import cpu_flags

ENV = "TF_ENABLE_ONEDNN_OPTS"
# CPU flags (Linux's names) for which TensorFlow turns oneDNN on by itself
# (tensorflow/core/util/util.cc, DefaultOneDnnPolicy).
TENSORFLOW_ONEDNN_FLAGS = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile",
                           "amx_int8", "amx_bf16")
# What oneDNN's float32 kernels need to beat Eigen's (measured with AVX2 and FMA).
ONEDNN_FLAGS = ("avx2", "fma")
X86_64 = ("x86_64", "amd64")
ONEDNN, EIGEN, TENSORFLOW = "oneDNN", "Eigen", "TensorFlow's choice"
# Set beside TF_ENABLE_ONEDNN_OPTS=1 when this module chose it, so that a process started
# from this one (a launcher's replica) reports the choice as its own, not as the user's.
MARK = "MLJOB_ONEDNN_CHOSEN"
AUTO_REASON = (f"auto: the CPU has AVX2 and FMA, where TensorFlow would keep Eigen's; {ENV}=0 "
               "keeps them")


@dataclasses.dataclass(frozen=True)
class Choice:
    """The CPU kernels a process computes with, and why (for its one log line)."""

    kernels: str   # ONEDNN, EIGEN or TENSORFLOW (left to TensorFlow)
    reason: str

    def line(self) -> str:
        return f"cpu kernels: {self.kernels} ({self.reason})"


def choose(environ: MutableMapping[str, str] | None = None, *,
           flags: Iterable[str] | None = None, machine: str | None = None,
           tensorflow_loaded: bool | None = None) -> Choice:
    """Decide, and set TF_ENABLE_ONEDNN_OPTS=1 in `environ` (os.environ unless given)
    where oneDNN is chosen and TensorFlow would not choose it. flags: the CPU's (None:
    /proc/cpuinfo's); machine: platform.machine()'s; tensorflow_loaded: whether
    TensorFlow is imported already (None: look in sys.modules)."""
    environ = os.environ if environ is None else environ
    if environ.get(ENV) == "1" and environ.get(MARK) == "1":
        return Choice(ONEDNN, AUTO_REASON)  # chosen so by the process that started this one
    if ENV in environ:
        value = environ[ENV].strip().lower()
        if value in ("1", "true"):
            return Choice(ONEDNN, f"{ENV}={environ[ENV]} as set")
        if value in ("0", "false"):
            return Choice(EIGEN, f"{ENV}={environ[ENV]} as set")
        return Choice(TENSORFLOW, f"{ENV}={environ[ENV]!r} is none of 0, 1, true, false: "
                      "TensorFlow keeps its default")
    machine = platform.machine() if machine is None else machine
    if machine.lower() not in X86_64:
        return Choice(TENSORFLOW, f"auto: a {machine or 'non-x86-64'} CPU")
    have = cpu_flags() if flags is None else frozenset(flags)
    native = [f for f in TENSORFLOW_ONEDNN_FLAGS if f in have]
    if native:
        return Choice(ONEDNN, f"auto: the CPU has {native[0]}, TensorFlow's own choice")
    missing = [f for f in ONEDNN_FLAGS if f not in have]
    if missing:
        return Choice(EIGEN, f"auto: the CPU has no {' or '.join(missing)}")
    if "tensorflow" in sys.modules if tensorflow_loaded is None else tensorflow_loaded:
        return Choice(EIGEN, "TensorFlow was imported before mljob.training: import "
                      f"mljob.training first, or set {ENV}=1, for oneDNN's kernels")
    environ[ENV] = environ[MARK] = "1"
    return Choice(ONEDNN, AUTO_REASON)


CHOSEN: Choice | None = None


def choose_once() -> Choice:
    """`choose()` the first time; the same Choice after."""
    global CHOSEN
    if CHOSEN is None:
        CHOSEN = choose()
    return CHOSEN


__all__ = ["Choice", "choose", "choose_once", "CHOSEN", "ENV", "MARK", "ONEDNN", "EIGEN",
           "TENSORFLOW"]
