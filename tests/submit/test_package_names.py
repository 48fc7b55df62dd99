"""Package names as pip normalises them (PEP 503: dashes, underscores, dots, case) on
every runner: the Kubeflow image's install step, run for real in a virtualenv, and the
local runner's package environment. `setup(name="census-trainer")` once became
`importlib.metadata.requires('census')` in the Dockerfile (PackageNotFoundError)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from submit import jobs as records
from submit.packaging import package as packages
from submit.__main__ import main
from submit.runners import kubeflow_render as kubeflow


@pytest.mark.parametrize("file_name,name", [
    ("trainer-0.1.tar.gz", "trainer"), ("census-trainer-0.1.tar.gz", "census-trainer"),
    ("census_trainer-0.1.tar.gz", "census-trainer"),
    ("Census.Trainer-1.0.0rc1.zip", "census-trainer"),
    ("Census_Trainer-0.1-py3-none-any.whl", "census-trainer"),
    ("my--odd__pkg-2024.1.post3.tar.gz", "my-odd-pkg"), ("mljob-0.1.0.tar.gz", "mljob")])
def test_the_distribution_name_of_an_archive_is_pips(file_name, name):
    assert packages.dist_name(file_name) == name


def write_package(folder, name: str, module: str, requires=()) -> str:
    os.makedirs(os.path.join(folder, module), exist_ok=True)
    with open(os.path.join(folder, "setup.py"), "w") as f:
        f.write(f"from setuptools import setup\nsetup(name={name!r}, version='0.1', "
                f"packages=[{module!r}], install_requires={list(requires)!r})\n")
    task = ("import importlib.metadata as m\n"
            f"print('version', m.version({name!r}), 'requires', m.requires({name!r}))\n")
    for file, text in (("__init__.py", ""), ("task.py", task)):
        with open(os.path.join(folder, module, file), "w") as f:
            f.write(text)
    return str(folder)


def test_the_kubeflow_install_step_installs_dashed_and_dotted_names(tmp_path):
    """The Dockerfile's RUN step in a virtualenv that sees this interpreter's packages
    (as the image sees TensorFlow's), with no index: a package named census-trainer
    whose sdist an older setuptools named census-trainer-0.1.tar.gz, and a --packages
    extra named Census.Utils; their requirements are found (pyyaml, satisfied here) and
    TensorFlow's is left to the base image."""
    main_pkg = packages.build(write_package(tmp_path / "a", "census-trainer", "census_trainer",
                                            ["pyyaml", "tensorflow>=2"]),
                              str(tmp_path / "build"))
    legacy = tmp_path / "build" / "census-trainer-0.1.tar.gz"  # the dashed file name
    shutil.move(main_pkg.local_file, legacy)
    extra = packages.build(write_package(tmp_path / "b", "Census.Utils", "census_utils",
                                         ["pyyaml>=3"]), str(tmp_path / "build2"))
    pkg = packages.Package(legacy.name, main_pkg.sha256, main_pkg.top_dir,
                           local_file=str(legacy), extras=(extra,))
    assert [p.dist_name for p in pkg.all] == ["census-trainer", "census-utils"]
    text = kubeflow.dockerfile(pkg, gpu=False)
    assert "census-trainer" in text and "census-utils" in text
    folder = kubeflow.build_context(pkg, gpu=False)
    run = " ".join(line[4:] if line.startswith("RUN ") else line
                   for line in text.splitlines() if line.startswith(("RUN ", " && ")))
    run = run.replace(" \\", "").replace(" && rm -r /tmp/mljob-packages", "")
    run = run.replace("/tmp/mljob-packages", folder)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    env = {**os.environ, "PATH": f"{venv}/bin:{os.environ['PATH']}",
           "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(["bash", "-c", run], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Requirement already satisfied: pyyaml" in done.stdout, done.stdout[-2000:]
    out = subprocess.run([f"{venv}/bin/python", "-m", "census_trainer.task"], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("version 0.1 requires ['pyyaml', 'tensorflow>=2']")
    assert subprocess.run([f"{venv}/bin/python", "-c", "import census_utils"], env=env,
                          cwd=tmp_path, timeout=60).returncode == 0


def test_the_local_runner_runs_a_dashed_package(capsys, tmp_path):
    folder = write_package(tmp_path / "pkg", "census-trainer", "census_trainer")
    status = main(["dashed", "--job-dir", str(tmp_path / "dashed"), "--package-path", folder,
                   "--module-name", "census_trainer.task"], standalone_mode=False)
    out, err = capsys.readouterr()
    assert status == 0, err
    assert records.load("dashed").state == records.SUCCEEDED
    assert "version 0.1 requires None" in out
