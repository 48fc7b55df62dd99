"""What a process imports before its work starts (`mljob.startup`): the command line
imports no TensorFlow, Keras, Optuna, Kubernetes, Vertex AI or NumPy for `--help` and
`jobs list`; a ps replica of the bundled trainer serves without Keras, its model or its
data, and imports Keras as before with MLJOB_QUICK_START=0."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.support.common import free_ports

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEAVY = ("tensorflow", "keras", "optuna", "kubernetes", "google.cloud.aiplatform", "numpy",
         "ray", "IPython")


def test_the_command_line_imports_nothing_heavy(tmp_path):
    code = ("import runpy, sys\n"
            "for argv in (['--help'], ['jobs', 'list'], ['jobs', '--help']):\n"
            "    sys.argv = ['submit', *argv]\n"
            "    try:\n        runpy.run_module('submit', run_name='__main__')\n"
            "    except SystemExit:\n        pass\n"
            f"print('HEAVY', [m for m in {HEAVY!r} if m in sys.modules])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT,
                               "MLJOB_HOME": str(tmp_path)})
    assert "HEAVY []" in done.stdout.splitlines(), (done.stdout[-300:], done.stderr[-500:])


# The ps replica reports, when its server listens, whether Keras was imported and whether
# the trainer loaded its data (its `data` mark) on the way.
_PS = """
import runpy, sys
from mljob import startup
mark = startup.mark
def spy(phase):
    mark(phase)
    if phase == "server":
        print("KERAS", "keras" in sys.modules, "DATA", "data" in startup._marked, flush=True)
startup.mark = spy
sys.argv = ["trainer.task", "--data-dir", sys.argv[1], "--job-dir", sys.argv[2]]
runpy.run_module("trainer.task", run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.parametrize("quick", ["1", "0"])
def test_a_ps_replica_serves_without_keras_model_or_data(reaper, tmp_path, quick):
    chief, worker, ps = free_ports(3)
    tf_config = {"cluster": {"chief": [f"127.0.0.1:{chief}"],
                             "worker": [f"127.0.0.1:{worker}"], "ps": [f"127.0.0.1:{ps}"]},
                 "task": {"type": "ps", "index": 0}}
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CONFIG": json.dumps(tf_config),
           "MLJOB_STARTUP_MARKS": "1", "MLJOB_QUICK_START": quick,
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    # --data-dir names nothing: a replica that loaded data would read the bundled sample.
    proc = reaper.python("-c", _PS, str(tmp_path / "no-data"), str(tmp_path / "job"),
                         cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("KERAS") or time.monotonic() > deadline:
            break
    reaper.stop(proc)
    report = next((line.split() for line in seen if line.startswith("KERAS")), None)
    assert report is not None, "".join(seen[-20:])
    assert report == ["KERAS", "False" if quick == "1" else "True", "DATA", "False"]
    phases = [line.split()[1] for line in seen if line.startswith("startup ")]
    assert phases == ["process", "main", "tensorflow", "server"]
    # With the shortcut on, the server's TensorFlow still gives Keras to whoever asks.
    if quick == "1":
        code = ("from mljob import startup; tf = startup.tensorflow_for_a_server(); "
                "import sys; print('keras' in sys.modules); import keras; "
                "print(tf.keras.layers.Dense is keras.layers.Dense)")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                              text=True, cwd=ROOT, timeout=240, env=env)
        assert done.stdout.split() == ["False", "True"], done.stderr[-500:]


_LEAN = """
import sys
from mljob import startup
with startup.lean_imports():
    from trainer import fit
left = [m for m in ("IPython", "matplotlib") if m in sys.modules]
import matplotlib.pyplot  # the user's own code still has it
print("LEFT", left, "keras" in sys.modules, "matplotlib.pyplot" in sys.modules)
"""


@pytest.mark.parametrize("quick", ["1", pytest.param("0", marks=pytest.mark.slow)])
def test_a_training_replica_imports_keras_without_ipython_and_matplotlib(tmp_path, quick):
    done = subprocess.run([sys.executable, "-c", _LEAN], capture_output=True, text=True,
                          cwd=ROOT, timeout=240,
                          env={**os.environ, "PYTHONPATH": ROOT, "MLJOB_QUICK_START": quick,
                               "TF_CPP_MIN_LOG_LEVEL": "2", "MPLBACKEND": "Agg"})
    line = next((x for x in done.stdout.splitlines() if x.startswith("LEFT")), None)
    assert line is not None, done.stderr[-800:]
    assert line == ("LEFT [] True True" if quick == "1"
                    else "LEFT ['IPython', 'matplotlib'] True True")
