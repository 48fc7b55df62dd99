"""A user project packaged by pyproject.toml alone (no setup.py), submitted as gcloud
users pass it (`--package-path` the package folder): built with the backend it declares,
so the sdist carries its own name and version and pip installs its dependency into the
job's environment. Before, the folder was taken for a bare package and given a generated
setup.py: name `ppjob`, version 0.0.0, no dependencies."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from submit import jobs as records
from submit.packaging import package
from tests.support.submit_cli import run as submit_in_process

DEP = "mljob_probe_dep"


def write(path, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))


def build_dependency(tmp_path) -> str:
    """A wheel of a dependency no index has, built here: pip can find it only where the
    job's pip configuration points (a local folder)."""
    src = tmp_path / "dep"
    write(src / "pyproject.toml", f"""\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "mljob-probe-dep"
        version = "1.0"

        [tool.setuptools]
        py-modules = ["{DEP}"]
        """)
    write(src / f"{DEP}.py", "VALUE = 'probe 42'\n")
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                    "--outdir", str(wheels), str(src)], check=True, capture_output=True,
                   timeout=300)
    assert [n for n in os.listdir(wheels) if n.endswith(".whl")]
    return str(wheels)


def write_project(root) -> str:
    write(root / "pyproject.toml", """\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "census-pp"
        version = "0.3"
        dependencies = ["mljob-probe-dep==1.0"]

        [tool.setuptools]
        packages = ["ppjob"]
        """)
    write(root / "ppjob" / "__init__.py", "")
    write(root / "ppjob" / "task.py", f"""\
        import {DEP}
        print("dependency", {DEP}.VALUE, "from", {DEP}.__file__, flush=True)
        """)
    return str(root / "ppjob")


def test_a_pyproject_project_is_packaged_by_its_pyproject(tmp_path):
    folder = write_project(tmp_path / "project")
    source = package.resolve_source(folder)
    assert source == package.Source(str(tmp_path / "project"))  # not a generated setup.py
    assert package.resolve_source(str(tmp_path / "project")) == source
    # a pyproject.toml holding only tools' settings does not say how to build
    write(tmp_path / "bare" / "pyproject.toml", "[tool.ruff]\nline-length = 100\n")
    write(tmp_path / "bare" / "barejob" / "task.py", "print(1)\n")
    bare = package.resolve_source(str(tmp_path / "bare" / "barejob"))
    assert bare.generated and bare.name == "barejob"


@pytest.mark.slow
def test_a_missing_build_backend_is_named_with_its_fix(tmp_path):
    folder = write_project(tmp_path / "project")
    text = (tmp_path / "project" / "pyproject.toml").read_text()
    (tmp_path / "project" / "pyproject.toml").write_text(text.replace(
        'requires = ["setuptools>=61"]', 'requires = ["mljob-no-such-backend>=1"]'))
    with pytest.raises(package.PackageError, match=r"cannot build the sdist of .*project: "
                       r"its build backend needs mljob-no-such-backend>=1.*pip install"):
        package.build(folder, str(tmp_path / "out"))


@pytest.mark.slow
def test_a_pyproject_only_project_runs_with_its_dependency(capsys, tmp_path, monkeypatch):
    if importlib.util.find_spec(DEP) is not None:
        pytest.skip(f"{DEP} is already in the base environment")
    wheels = build_dependency(tmp_path)
    monkeypatch.setenv("PIP_FIND_LINKS", wheels)  # beside pip's own index, which lacks it
    monkeypatch.setenv("MLJOB_ENV_CACHE", str(tmp_path / "envs"))
    folder = write_project(tmp_path / "project")
    status, out, err = submit_in_process(
        capsys, "pp01", "--package-path", folder, "--module-name", "ppjob.task",
        "--job-dir", str(tmp_path / "job"))
    assert status == 0, err + out[-3000:]
    assert f"master-replica-0\tdependency probe 42 from {tmp_path / 'envs'}" in out
    # mljob's core (every replica's launcher) goes beside the package once, whatever the
    # package's dependencies are named
    installing = [line for line in out.splitlines() if ": installing " in line]
    assert installing and installing[0].count("mljob-0.1.0.tar.gz") == 1, installing
    record = records.load("pp01")
    assert record.state == records.SUCCEEDED
    name = os.path.basename(record.package_url)
    assert package.dist_name(name) == "census-pp" and name.endswith("-0.3.tar.gz")
    assert importlib.util.find_spec(DEP) is None  # installed into the job's environment only
