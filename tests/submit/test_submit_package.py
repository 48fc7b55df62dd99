"""Packages: package folders built as gcloud builds them, unsafe archives refused,
environments pip-installed atomically and reused, pip's failures named in one line, and
a staged package that changed after staging refused."""
from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import tarfile
import threading

import pytest

from submit.packaging import package
from submit.errors import PackageError, PackageUsageError
from tests.support.submit_cli import write_package


def make_tar(path, members) -> str:
    """members: (name, kind, payload) with kind file|dir|symlink|hardlink."""
    with tarfile.open(path, "w:gz") as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                data = payload.encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
                         "hardlink": tarfile.LNKTYPE}[kind]
            info.linkname = payload or ""
            tar.addfile(info)
    return str(path)


GOOD = [("pkg-1.0", "dir", None), ("pkg-1.0/setup.py", "file", "setup()\n"),
        ("pkg-1.0/mod/__init__.py", "file", "X = 1\n"),
        ("pkg-1.0/link.py", "symlink", "mod/__init__.py")]


@pytest.mark.parametrize("bad", [
    ("pkg-1.0/../../evil.py", "file", "boom"),
    ("/tmp/evil.py", "file", "boom"),
    ("pkg-1.0/up", "symlink", "../../outside"),
    ("pkg-1.0/abs", "symlink", "/etc/passwd"),
    ("pkg-1.0/hard", "hardlink", "/etc/passwd"),
    ("pkg-1.0/hard2", "hardlink", "../outside"),
])
def test_members_escaping_their_folder_are_refused(tmp_path, bad):
    archive = make_tar(tmp_path / "bad.tar.gz", GOOD + [bad])
    dest = tmp_path / "out"
    with pytest.raises(PackageUsageError, match="outside its folder|escapes its folder"):
        package.safe_extract(archive, str(dest))
    assert not (tmp_path / "evil.py").exists() and not (tmp_path / "outside").exists()
    assert not dest.exists() or not any(dest.rglob("*.py"))


def test_a_clean_archive_extracts(tmp_path):
    archive = make_tar(tmp_path / "good.tar.gz", GOOD)
    package.safe_extract(archive, str(tmp_path / "out"))
    assert (tmp_path / "out" / "pkg-1.0" / "mod" / "__init__.py").read_text() == "X = 1\n"
    assert os.readlink(tmp_path / "out" / "pkg-1.0" / "link.py") == "mod/__init__.py"


def test_content_hash_ignores_archive_timestamps(tmp_path):
    first = make_tar(tmp_path / "a.tar.gz", GOOD)
    os.utime(first, (1, 1))
    second = make_tar(tmp_path / "b.tar.gz", list(reversed(GOOD)))
    assert package.content_hash(first) == package.content_hash(second)
    changed = make_tar(tmp_path / "c.tar.gz", GOOD[:2] + [("pkg-1.0/mod/__init__.py",
                                                          "file", "X = 2\n")])
    assert package.content_hash(changed)[0] != package.content_hash(first)[0]
    assert package.content_hash(first)[1] == "pkg-1.0"


def fakejob_sdist(tmp_path, setup_extra: str = "") -> package.Package:
    """A real sdist of a tiny package, staged at its local path."""
    folder = tmp_path / "src"
    write_package(folder, "print('fakejob ran')\n")
    if setup_extra:
        (folder / "setup.py").write_text(
            "from setuptools import setup\n"
            f'setup(name="fakejob", version="0.1", packages=["fakejob"], {setup_extra})\n')
    built = package.build(str(folder), str(tmp_path / "dist"))
    return dataclasses.replace(built, url=built.local_file)


def env_run(env: str, code: str) -> str:
    python = os.path.join(env, "bin", "python")
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": ""}, timeout=120).stdout.strip()


def test_environment_is_built_once_even_when_raced(tmp_path):
    pkg = fakejob_sdist(tmp_path)
    key = package.environment_key([pkg])
    root = str(tmp_path / "envs")
    results, errors = [], []

    def build():
        try:
            results.append(package.ensure_environment([pkg], key, root=root))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert errors == []
    assert {env for env, _ in results} == {os.path.join(root, key)}
    assert sum(created for _, created in results) == 1
    # the link and the one folder it names: the loser's copy is gone
    assert sorted(os.listdir(root)) == sorted([key, os.readlink(os.path.join(root, key))])
    env = os.path.join(root, key)
    # the package is installed; this interpreter's packages (mljob's dependencies) are seen
    assert env_run(env, "import fakejob, fsspec, sys; print(sys.prefix)") == env
    assert package.ensure_environment([pkg], key, root=root) == (env, False)


def test_an_abandoned_build_is_removed_and_never_used(tmp_path):
    pkg = fakejob_sdist(tmp_path)
    key = package.environment_key([pkg])
    root = tmp_path / "envs"
    dead = root / f"{key}.999999999-deadbeef"  # its builder was killed half way
    (dead / "bin").mkdir(parents=True)
    env, created = package.ensure_environment([pkg], key, root=str(root))
    assert created and not dead.exists()
    assert os.readlink(env) != dead.name


@pytest.mark.parametrize("tool, says", [
    ("pip", "pip says 'Could not find a version that satisfies the requirement"),
    ("uv", "uv says 'Because mljob-no-such-package-xq7 was not found in the package "
           "registry")])
def test_a_dependency_that_cannot_be_installed_names_itself_and_leaves_nothing(
        tmp_path, monkeypatch, tool, says):
    from submit.packaging import envs
    monkeypatch.setenv(envs.INSTALLER_ENV, tool)
    if tool == "uv" and envs.installer() is None:
        pytest.skip("uv is not installed")
    pkg = fakejob_sdist(tmp_path, 'install_requires=["mljob-no-such-package-xq7>=1"]')
    key = package.environment_key([pkg])
    root = tmp_path / "envs"
    with pytest.raises(PackageError) as info:
        package.ensure_environment([pkg], key, root=str(root))
    message = str(info.value)
    assert "cannot install 'mljob-no-such-package-xq7>=1'" in message
    assert says in message
    assert "\n" not in message
    assert os.listdir(root) == [f"{key}.pip.log"]  # pip's output, and no environment


def test_pip_failures_name_the_requirement_and_the_reason():
    output = ("Processing ./x.tar.gz\nERROR: Could not find a version that satisfies the "
              "requirement nope>=2 (from x==0.1) (from versions: none)\n"
              "ERROR: No matching distribution found for nope>=2\n")
    assert package.pip_failure(output) == (
        "'nope>=2'", "Could not find a version that satisfies the requirement nope>=2 "
        "(from x==0.1) (from versions: none)")
    assert package.pip_failure("ERROR: Failed building wheel for lxml\n")[0] == "'lxml'"
    assert package.pip_failure("killed\n") == ("the job's packages", "killed")
    uv = ("Using Python 3.11.7 environment at: env\n"
          "error: No solution found when resolving dependencies\n"
          "  cause: Because nope was not found in the package registry and x==0.1 depends "
          "on nope>=2, we can conclude that x==0.1 cannot be used.\n")
    assert package.pip_failure(uv) == (
        "'nope>=2'", "Because nope was not found in the package registry and x==0.1 "
        "depends on nope>=2, we can conclude that x==0.1 cannot be used.")
    # uv wraps its causes at the terminal's width (80 where there is none): the same
    wrapped = ("error: No solution found when resolving dependencies\n"
               "  cause: Because nope was not found in the package registry\n"
               "         and x==0.1 depends on nope>=2, we can\n"
               "         conclude that x==0.1 cannot be used.\n"
               "  hint: something else\n")
    assert package.pip_failure(wrapped) == package.pip_failure(uv)


def test_a_package_changed_after_staging_is_refused(tmp_path):
    archive = make_tar(tmp_path / "pkg-1.0.tar.gz", GOOD)
    sha, top = package.content_hash(archive)
    make_tar(archive, GOOD[:2])  # replaced in the staging bucket
    pkg = package.Package("pkg-1.0.tar.gz", sha, top, url=archive)
    with pytest.raises(PackageError, match="changed since it was staged"):
        package.ensure_environment([pkg], "0" * 64, root=str(tmp_path / "envs"))
    assert os.listdir(tmp_path / "envs") == []


def test_a_staged_package_with_an_escaping_member_never_becomes_an_environment(tmp_path):
    archive = make_tar(tmp_path / "pkg-1.0.tar.gz",
                       GOOD + [("pkg-1.0/../../evil.py", "file", "boom")])
    sha, top = package.content_hash(archive)
    pkg = package.Package("pkg-1.0.tar.gz", sha, top, url=archive)
    with pytest.raises(PackageUsageError, match="escapes its folder"):
        package.ensure_environment([pkg], "0" * 64, root=str(tmp_path / "envs"))
    assert os.listdir(tmp_path / "envs") == []
    assert not (tmp_path / "evil.py").exists()


def test_a_bare_package_folder_is_built_with_a_generated_setup_py(tmp_path):
    """gcloud's --package-path: the package folder; without setup.py here or in the
    parent, a minimal one is generated and every file of the package is shipped."""
    folder = tmp_path / "project" / "trainer"
    (folder / "sub").mkdir(parents=True)
    (folder / "task.py").write_text("import trainer.sub.util\n")
    (folder / "sub" / "util.py").write_text("X = 1\n")
    (folder / "vocab.txt").write_text("a b c\n")
    (tmp_path / "project" / "unrelated.py").write_text("")
    source = package.resolve_source(str(folder))
    assert source == package.Source(str(tmp_path / "project"), "trainer")
    built = package.build(source, str(tmp_path / "dist"))
    assert built.file_name == "trainer-0.0.0.tar.gz"
    with tarfile.open(built.local_file) as tar:
        names = set(tar.getnames())
    assert {"trainer-0.0.0/trainer/task.py", "trainer-0.0.0/trainer/sub/util.py",
            "trainer-0.0.0/trainer/vocab.txt", "trainer-0.0.0/setup.py"} <= names
    assert not any("unrelated" in n for n in names)
    # with a setup.py in the parent, the parent is built as it is
    (tmp_path / "project" / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='proj', version='2.0', "
        "packages=['trainer', 'trainer.sub'])\n")
    assert package.resolve_source(str(folder)) == package.Source(str(tmp_path / "project"))
    assert package.build(str(folder), str(tmp_path / "d2")).file_name == "proj-2.0.tar.gz"


def test_mljob_core_sdist_holds_mljob_alone_and_is_found_when_imported(tmp_path):
    core = package.build_mljob_core(str(tmp_path / "core"))
    with tarfile.open(core.local_file) as tar:
        tops = {n.split("/")[1] for n in tar.getnames() if n.count("/") >= 1}
    assert "mljob" in tops and "trainer" not in tops and "submit" not in tops
    uses = tmp_path / "uses" / "trainer"
    uses.mkdir(parents=True)
    (uses / "task.py").write_text("import os\nfrom mljob import storage\n")
    assert package.imports_mljob(package.build(str(uses), str(tmp_path / "d1")))
    (uses / "task.py").write_text("import os\nprint('from mljob import x')\n")
    assert not package.imports_mljob(package.build(str(uses), str(tmp_path / "d2")))


def test_the_installer_setting_is_checked(monkeypatch):
    from submit.packaging import envs
    monkeypatch.setenv(envs.INSTALLER_ENV, "conda")
    with pytest.raises(PackageUsageError, match=r"MLJOB_ENV_INSTALLER='conda' is not an "
                                                r"installer; use pip, uv or auto"):
        envs.installer()
    monkeypatch.setenv(envs.INSTALLER_ENV, "pip")
    assert envs.installer() is None
    monkeypatch.delenv(envs.INSTALLER_ENV)
    assert envs.installer() is None  # pip unless asked: see envs.installer
