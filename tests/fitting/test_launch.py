"""mljob's launcher runs a module as `python -m` does, and patches Keras's `fit` only
for a replica in a cluster, only once Keras is imported, and never when switched off."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.common import ROOT

CLUSTER = json.dumps({"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
                      "task": {"type": "chief", "index": 0}})

SCRIPT = '''\
import json, sys
import_keras = "--keras" in sys.argv
if import_keras:
    import keras
report = {"argv": sys.argv[1:], "name": __name__, "file": __file__,
          "tensorflow": "tensorflow" in sys.modules}
if import_keras:
    report["patched"] = hasattr(keras.Model.fit, "_mljob_original")
    report["evaluate_patched"] = hasattr(keras.Model.evaluate, "_mljob_original")
print("REPORT " + json.dumps(report))
if "--exit" in sys.argv:
    sys.exit(int(sys.argv[sys.argv.index("--exit") + 1]))
if "--raise" in sys.argv:
    raise RuntimeError("the script's own bug")
'''


@pytest.fixture
def package(tmp_path):
    pkg = tmp_path / "userpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "task.py").write_text(SCRIPT)
    return tmp_path


def launch(cwd, *args, **env):
    full = {**os.environ, "PYTHONPATH": ROOT, **env}
    for name, value in env.items():
        if value is None:
            full.pop(name)
    return subprocess.run([sys.executable, "-m", "mljob.fitting.launch", *args], cwd=cwd,
                          env=full, capture_output=True, text=True, timeout=300)


def report(out: str) -> dict:
    line = next(x for x in out.splitlines() if x.startswith("REPORT "))
    return json.loads(line[len("REPORT "):])


def test_runs_the_module_as_python_m_does(package):
    ran = launch(package, "userpkg.task", "--flag", "x", TF_CONFIG=None, CLUSTER_SPEC=None)
    assert ran.returncode == 0, ran.stderr
    got = report(ran.stdout)
    assert got["argv"] == ["--flag", "x"] and got["name"] == "__main__"
    assert got["file"] == str(package / "userpkg" / "task.py")
    direct = subprocess.run([sys.executable, "-m", "userpkg.task", "--flag", "x"],
                            cwd=package, capture_output=True, text=True, timeout=120)
    assert report(direct.stdout) == got


def test_exit_status_and_the_scripts_traceback_pass_through(package):
    ran = launch(package, "userpkg.task", "--exit", "3")
    assert ran.returncode == 3
    ran = launch(package, "userpkg.task", "--raise")
    assert ran.returncode == 1
    assert "Traceback" in ran.stderr and "RuntimeError: the script's own bug" in ran.stderr


def test_a_missing_module_is_pythons_own_one_line(package):
    ran = launch(package, "userpkg.nosuch")
    assert ran.returncode == 1
    assert ran.stderr.strip().endswith("No module named userpkg.nosuch")
    assert "Traceback" not in ran.stderr
    ran = launch(package)
    assert ran.returncode == 2 and "usage: python -m mljob.fitting.launch" in ran.stderr


def test_a_script_without_keras_loads_neither_keras_nor_tensorflow(package):
    ran = launch(package, "userpkg.task", TF_CONFIG=CLUSTER)
    assert ran.returncode == 0, ran.stderr
    assert report(ran.stdout)["tensorflow"] is False


@pytest.mark.parametrize("tf_config, switch, patched", [
    (CLUSTER, None, True),
    (CLUSTER, "0", False),
    (CLUSTER, "off", False),
    (None, None, False),   # one node: Keras's fit untouched
    (json.dumps({"cluster": {"chief": ["127.0.0.1:1"]},
                 "task": {"type": "chief", "index": 0}}), None, False),
])
def test_fit_is_patched_only_in_a_cluster_and_unless_switched_off(package, tf_config,
                                                                  switch, patched):
    ran = launch(package, "userpkg.task", "--keras", TF_CONFIG=tf_config,
                 MLJOB_KERAS_FIT=switch, CLUSTER_SPEC=None)
    assert ran.returncode == 0, ran.stderr
    got = report(ran.stdout)
    assert got["patched"] is patched and got["evaluate_patched"] is patched
