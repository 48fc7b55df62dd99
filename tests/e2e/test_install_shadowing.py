"""mljob installed as users install it (`pip install .`, not editable), run from a project
that holds its own `trainer/` package, as Cloud ML's convention has it: `submit` and
`predict` never import the name `trainer`, so the user's package cannot shadow ours."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.common import ROOT

USER_TASK = """\
import argparse
print("the user's own trainer")
"""
USER_SETUP = """\
from setuptools import find_packages, setup
setup(name="user-trainer", version="1.0", packages=find_packages())
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A virtual environment that sees the base interpreter's packages (TensorFlow and the
    rest) with mljob pip-installed into it from the source tree, not editable."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    python = str(venv / "bin" / "python")
    build = tmp_path_factory.mktemp("build")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", ROOT], check=True, timeout=300,
                   cwd=str(build), capture_output=True)
    return python


def clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.pop("TF_CONFIG", None)
    return env


def test_mljob_is_installed_not_linked(installed, tmp_path):
    out = subprocess.run([installed, "-c", "import mljob, submit; print(mljob.__file__); "
                          "print(submit.__file__)"], cwd=tmp_path, env=clean_env(),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    for path in out.split():
        assert "site-packages" in path and not path.startswith(ROOT), path


def test_submit_and_predict_run_beside_a_users_trainer(installed, tmp_path):
    project = tmp_path / "project"
    (project / "trainer").mkdir(parents=True)
    (project / "trainer" / "__init__.py").write_text("")
    (project / "trainer" / "task.py").write_text(USER_TASK)
    (project / "setup.py").write_text(USER_SETUP)
    env = {**clean_env(), "MLJOB_HOME": str(tmp_path / "home")}
    dry = subprocess.run(
        [installed, "-m", "submit", "job01", "--scale-tier", "STANDARD_1", "--package-path",
         ".", "--job-dir", str(tmp_path / "jobs" / "job01"), "--dry-run", "--",
         "--max_steps=10"], cwd=project, env=env, capture_output=True, text=True,
        timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert '"module": "trainer.task"' in dry.stdout and "ImportError" not in dry.stderr
    helped = subprocess.run([installed, "-m", "predict", "--help"], cwd=project, env=env,
                            capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "usage" in helped.stdout.lower(), helped.stderr
    # and the user's trainer is what `trainer` means in their folder
    mine = subprocess.run([installed, "-m", "trainer.task"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=60)
    assert mine.stdout.strip() == "the user's own trainer"


def test_no_module_outside_trainer_imports_it():
    found = subprocess.run(["grep", "-rnE", r"^\s*(from trainer|import trainer)", "submit",
                            "predict", "mljob"], cwd=ROOT, capture_output=True, text=True)
    assert found.stdout == ""
