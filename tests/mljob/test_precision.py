"""`--mixed-precision auto`: the precision a job computes in, decided from the CPU's
flags (or the GPUs' compute capabilities) without TensorFlow, with the flags injected."""
from __future__ import annotations

import subprocess
import sys

import pytest

from mljob.training import precision

# /proc/cpuinfo as three real machines show it (flags cut to the ones that matter).
EPYC_GENOA = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512vl avx512_bf16 avx512_vnni
"""
SAPPHIRE_RAPIDS = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu sse2 avx2 avx512f avx512bw amx_bf16 amx_tile amx_int8
"""
ZEN2 = """processor\t: 0
model name\t: AMD EPYC 7R32
flags\t\t: fpu sse2 avx avx2 fma
"""
GRAVITON = """processor\t: 0
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics bf16
"""


@pytest.mark.parametrize("cpuinfo, policy", [
    (EPYC_GENOA, precision.BFLOAT16), (SAPPHIRE_RAPIDS, precision.BFLOAT16),
    (ZEN2, precision.OFF), (GRAVITON, precision.OFF), ("", precision.OFF)])
def test_auto_follows_the_cpu_flags(cpuinfo, policy):
    choice = precision.resolve("auto", flags=precision.cpu_flags(cpuinfo))
    assert choice.policy == policy
    line = choice.line()
    assert "\n" not in line and line.startswith(f"mixed precision: {policy} ")
    assert ("bfloat16 compute" in line) == (policy == precision.BFLOAT16)


def test_the_reason_names_the_flag_found():
    assert "avx512_bf16" in precision.resolve(
        "auto", flags=precision.cpu_flags(EPYC_GENOA)).line()
    assert "amx_bf16" in precision.resolve(
        "auto", flags=precision.cpu_flags(SAPPHIRE_RAPIDS)).line()


def test_flags_come_from_the_first_flags_line_only():
    flags = precision.cpu_flags("flags : avx2\nflags : avx512_bf16\n")
    assert flags == {"avx2"}
    # a flag's name inside another word is not the flag
    assert precision.resolve("auto", flags=["no_avx512_bf16x"]).policy == precision.OFF


def test_asked_precisions_are_kept_whatever_the_hardware():
    assert precision.resolve("off", flags=["avx512_bf16"]).policy == precision.OFF
    assert precision.resolve("mixed_bfloat16", flags=[]).policy == precision.BFLOAT16
    with pytest.raises(ValueError, match="float16"):
        precision.resolve("float16", flags=[])


def test_gpus_decide_over_the_cpu():
    assert precision.resolve("auto", flags=[], gpu_capabilities=[(8, 0)]).policy \
        == precision.BFLOAT16
    assert precision.resolve("auto", flags=["amx_bf16"], gpu_capabilities=[(7, 5)]).policy \
        == precision.OFF
    # one old GPU among new ones: float32 for all, the replicas compute alike
    assert precision.resolve("auto", flags=[], gpu_capabilities=[(9, 0), (7, 0)]).policy \
        == precision.OFF


def test_this_machine_is_read_from_proc_cpuinfo(monkeypatch, tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(SAPPHIRE_RAPIDS)
    monkeypatch.setattr(precision, "CPUINFO", str(info))
    assert precision.resolve("auto").policy == precision.BFLOAT16
    monkeypatch.setattr(precision, "CPUINFO", str(tmp_path / "missing"))
    assert precision.resolve("auto").policy == precision.OFF


def test_no_tensorflow_at_import():
    code = ("import sys, mljob.training.precision as p; p.resolve('auto'); "
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("cpuinfo, wire", [
    (EPYC_GENOA, "bfloat16"), (SAPPHIRE_RAPIDS, "bfloat16"),
    (ZEN2, "float32"),
    ("flags : fpu sse2 avx2 fma avx_vnni avx_ne_convert\n", "bfloat16"),  # no AVX-512
    ("flags : fpu sse2 avx2 fma avx512_fake\n", "float32"),
])
def test_the_wire_is_bfloat16_only_where_onednn_computes_it(cpuinfo, wire):
    """Under ps with local steps, unset: bfloat16 on the wire where the CPU has AVX-512
    (or AVX-NE-CONVERT), which oneDNN's bfloat16 needs; elsewhere TensorFlow's oneDNN
    logs an ERROR in every worker and falls back to Eigen, so the default is float32."""
    chosen = precision.wire_dtype(None, True, flags=precision.cpu_flags(cpuinfo))
    assert chosen.dtype == wire
    if wire == "float32":
        assert "no AVX-512" in chosen.reason


def test_the_wire_as_asked_and_without_local_steps():
    assert precision.wire_dtype("bfloat16", True, flags=[]).dtype == "bfloat16"
    assert precision.wire_dtype("float32", True, flags=["avx512f"]).dtype == "float32"
    assert precision.wire_dtype(None, False, flags=["avx512f"]).dtype == "float32"
