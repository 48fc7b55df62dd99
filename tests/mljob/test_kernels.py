"""TensorFlow's CPU kernels chosen by the hardware: oneDNN's where the CPU has AVX2 and
FMA and TensorFlow would keep Eigen's; the user's TF_ENABLE_ONEDNN_OPTS kept; what
TensorFlow then runs with, checked in real processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mljob.training import kernels, precision
from tests.mljob.test_precision import EPYC_GENOA, GRAVITON, SAPPHIRE_RAPIDS, ZEN2

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def choose(cpuinfo: str, environ: dict | None = None, machine: str = "x86_64",
           loaded: bool = False) -> tuple[kernels.Choice, dict]:
    environ = {} if environ is None else environ
    choice = kernels.choose(environ, flags=precision.cpu_flags(cpuinfo), machine=machine,
                            tensorflow_loaded=loaded)
    return choice, environ


def test_avx2_and_fma_alone_turn_onednn_on():
    choice, environ = choose(ZEN2)
    assert choice.kernels == kernels.ONEDNN
    assert environ == {"TF_ENABLE_ONEDNN_OPTS": "1", "MLJOB_ONEDNN_CHOSEN": "1"}
    line = choice.line()
    assert line.startswith("cpu kernels: oneDNN (auto: ") and "\n" not in line
    assert "TF_ENABLE_ONEDNN_OPTS=0" in line  # how to go back
    # a process started from this one inherits the choice and says it is the auto one
    child, child_env = choose(ZEN2, dict(environ))
    assert child.line() == line and child_env == environ
    # a user's 0 beside the inherited mark is the user's
    mine, _ = choose(ZEN2, {"TF_ENABLE_ONEDNN_OPTS": "0", "MLJOB_ONEDNN_CHOSEN": "1"})
    assert mine.kernels == kernels.EIGEN and "as set" in mine.line()


@pytest.mark.parametrize("cpuinfo, flag", [(EPYC_GENOA, "avx512_vnni"),
                                           (SAPPHIRE_RAPIDS, "amx_tile")])
def test_where_tensorflow_turns_onednn_on_itself_nothing_is_set(cpuinfo, flag):
    choice, environ = choose(cpuinfo)
    assert choice.kernels == kernels.ONEDNN and flag in choice.reason
    assert environ == {}


@pytest.mark.parametrize("cpuinfo, machine", [
    ("flags : sse2 avx\n", "x86_64"),          # no AVX2: Eigen's
    ("flags : sse2 avx avx2\n", "x86_64"),     # AVX2 without FMA
    (GRAVITON, "aarch64"),                     # not x86-64: TensorFlow decides
    (ZEN2, "aarch64")])
def test_other_cpus_are_left_alone(cpuinfo, machine):
    choice, environ = choose(cpuinfo, machine=machine)
    assert choice.kernels != kernels.ONEDNN and environ == {}


@pytest.mark.parametrize("value, chosen", [("0", kernels.EIGEN), ("false", kernels.EIGEN),
                                           ("1", kernels.ONEDNN), ("TRUE", kernels.ONEDNN),
                                           ("yes", kernels.TENSORFLOW)])
def test_the_users_setting_is_kept(value, chosen):
    choice, environ = choose(ZEN2, {"TF_ENABLE_ONEDNN_OPTS": value})
    assert environ == {"TF_ENABLE_ONEDNN_OPTS": value}
    assert choice.kernels == chosen and "TF_ENABLE_ONEDNN_OPTS" in choice.line()


def test_after_tensorflow_nothing_changes_and_the_line_says_why():
    choice, environ = choose(ZEN2, loaded=True)
    assert choice.kernels == kernels.EIGEN and environ == {}
    assert "import mljob.training first" in choice.line()


PROBE = r"""
import json, os, sys
if sys.argv[1] == "tensorflow-first":
    import tensorflow
import mljob.training
from mljob.training import kernels
from tensorflow.python.util import _pywrap_util_port
print(json.dumps({"chosen": kernels.CHOSEN.kernels, "line": kernels.CHOSEN.line(),
                  "env": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
                  "mark": os.environ.get("MLJOB_ONEDNN_CHOSEN"),
                  "onednn": bool(_pywrap_util_port.IsMklEnabled())}))
"""


def probe(order: str, env: dict) -> dict:
    child = {k: v for k, v in os.environ.items()
             if k not in ("TF_ENABLE_ONEDNN_OPTS", "MLJOB_ONEDNN_CHOSEN")}
    child.update(env, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", PROBE, order], capture_output=True,
                         text=True, timeout=300, env=child, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_tensorflow_runs_with_the_kernels_the_line_names():
    """A real process: what TensorFlow reports it runs with is what was chosen, on this
    machine whatever its CPU (oneDNN where the choice turned it on or TensorFlow did)."""
    got = probe("mljob-first", {})
    if got["chosen"] == kernels.ONEDNN:
        assert got["onednn"] is True
    elif got["chosen"] == kernels.EIGEN:
        assert got["onednn"] is False
    this = kernels.choose({}, tensorflow_loaded=False)
    assert got["chosen"] == this.kernels


def test_a_users_zero_keeps_eigens_kernels_in_tensorflow():
    got = probe("mljob-first", {"TF_ENABLE_ONEDNN_OPTS": "0"})
    assert got == {"chosen": kernels.EIGEN, "line": got["line"], "env": "0", "mark": None,
                   "onednn": False}


def test_tensorflow_imported_first_is_reported_as_it_runs():
    got = probe("tensorflow-first", {})
    this = kernels.choose({}, tensorflow_loaded=False)
    if this.kernels == kernels.ONEDNN and "TensorFlow's own choice" not in this.reason:
        # this CPU is one the choice turns oneDNN on for: too late here
        assert got["chosen"] == kernels.EIGEN and got["onednn"] is False
        assert got["env"] is None
