"""The package environment cache, each test with a cache of its own (never one another
test happened to fill): a package changed under the same file name gets a new
environment and runs its new code; a builder killed between the build's steps leaves
no published environment, and the next job builds a complete one."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from submit import jobs as records
from submit.packaging import package
from tests.support.common import ROOT
from tests.support.submit_cli import run as submit_in_process, write_package


def _task(version: int) -> str:
    return f"print('fakejob code version {version}', flush=True)\n"


def test_a_changed_package_with_the_same_file_name_runs_its_new_code(capsys, tmp_path,
                                                                     monkeypatch):
    monkeypatch.setenv("MLJOB_ENV_CACHE", str(tmp_path / "envs"))  # empty: ours alone
    pkg = write_package(tmp_path / "pkg", _task(1))
    args = ["--package-path", pkg, "--module-name", "fakejob.task"]
    outputs, shas = [], []
    for version, job_id in ((1, "same1"), (2, "same2")):
        if version == 2:  # the same package name and version: fakejob-0.1.tar.gz again
            write_package(tmp_path / "pkg", _task(2))
        status, out, err = submit_in_process(capsys, job_id, "--job-dir",
                                             str(tmp_path / job_id), *args)
        assert status == 0, err
        record = records.load(job_id)
        shas.append(record.package_sha256)
        log = (tmp_path / job_id / "logs" / "master-replica-0.log").read_text()
        outputs.append((out, log))
    assert shas[0] != shas[1]
    for version, (out, log) in enumerate(outputs, start=1):
        assert f"fakejob code version {version}" in log
        assert f"fakejob code version {3 - version}" not in log
        assert "package environment" in out and " created in " in out  # built, not reused
    envs = sorted(n for n in os.listdir(tmp_path / "envs")
                  if os.path.islink(tmp_path / "envs" / n))
    assert len(envs) == 2  # one environment a package content


CRASHING_BUILDER = r'''
import json, os, sys
from submit.packaging import envs, package
step, root, key, pkg = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])

def crash(*args, **kwargs):
    os._exit(137)  # as SIGKILL would: no finally, no cleanup

real_open, real_symlink = open, os.symlink

def opening(path, *args, **kwargs):
    if step == "marker" and str(path).endswith(package.ENV_MARKER):
        crash()
    return real_open(path, *args, **kwargs)

def linking(src, dst, *args, **kwargs):
    if step == "link":
        crash()
    return real_symlink(src, dst, *args, **kwargs)

envs.open = opening      # the module's own open, before the builtin
os.symlink = linking
if step in ("_create_venv", "_pip_install"):
    setattr(envs, step, crash)
envs.ensure_environment([package.Package(**pkg)], key, root=root)
'''


def _sdist(tmp_path) -> package.Package:
    write_package(tmp_path / "src", _task(7))
    built = package.build(str(tmp_path / "src"), str(tmp_path / "dist"))
    return dataclasses.replace(built, url=built.local_file)


@pytest.mark.parametrize("step", [pytest.param("_pip_install", marks=pytest.mark.slow),
                                  "marker"])
def test_a_builder_killed_between_steps_publishes_nothing(tmp_path, step):
    """Killed before pip runs, or while writing the completion marker (after pip): the
    environment's name is not published, or names a complete environment; the next
    job's build removes the leftovers and gives an environment that runs the package."""
    pkg = _sdist(tmp_path)
    key = package.environment_key([pkg])
    root = tmp_path / "envs"
    fields = {f.name: getattr(pkg, f.name) for f in dataclasses.fields(pkg)}
    crashed = subprocess.run(
        [sys.executable, "-c", CRASHING_BUILDER, step, str(root), key, json.dumps(fields)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert crashed.returncode == 137, crashed.stderr
    target = root / key
    leftovers = [n for n in os.listdir(root) if n.startswith(key + ".")
                 and not n.endswith(".pip.log")]
    assert len(leftovers) == 1  # the killed builder's folder, never renamed
    if os.path.lexists(target):  # published: only ever complete
        assert json.loads((target / package.ENV_MARKER).read_text())["packages"]
    env, created = package.ensure_environment([pkg], key, root=str(root))
    assert created and env == str(target)
    assert json.loads((target / package.ENV_MARKER).read_text())["packages"][0][
        "sha256"] == pkg.sha256
    assert sorted(os.listdir(root)) == sorted([key, os.readlink(target)])  # no leftovers
    ran = subprocess.run([str(target / "bin" / "python"), "-m", "fakejob.task"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": ""})
    assert ran.stdout == "fakejob code version 7\n", ran.stderr
