"""The sdist cache (submit.packaging.sdist_cache): an unchanged package is not built again, and
any change to what the build reads builds again: a kept sdist that no longer matches
its package is never used."""
from __future__ import annotations

import json
import os
import tarfile

import pytest

from submit.packaging import package, sdist_cache


@pytest.fixture
def builds(monkeypatch):
    """Counts the real builds (`python -m build` runs) package.build makes."""
    calls: list[str] = []
    real = package._sdist

    def counting(src, dist, out_dir, what):
        calls.append(what)
        return real(src, dist, out_dir, what)

    monkeypatch.setattr(package, "_sdist", counting)
    return calls


def _project(folder, version="1.0"):
    (folder / "proj").mkdir(parents=True, exist_ok=True)
    (folder / "setup.py").write_text(
        "from setuptools import setup\n"
        f"setup(name='proj', version='{version}', packages=['proj'])\n")
    (folder / "proj" / "__init__.py").write_text("")
    (folder / "proj" / "task.py").write_text("VALUE = 1\n")
    return folder


def _member(pkg, name):
    with tarfile.open(pkg.local_file) as tar:
        member = tar.extractfile(f"{pkg.top_dir}/{name}")
        return member.read().decode() if member else None


def _build(folder, tmp_path, n, **kw):
    return package.build(str(folder), str(tmp_path / f"out{n}"), **kw)


def test_an_unchanged_package_is_reused_and_each_change_builds_again(tmp_path, builds):
    src = _project(tmp_path / "src")
    first = _build(src, tmp_path, 1)
    assert len(builds) == 1
    again = _build(src, tmp_path, 2)
    assert len(builds) == 1  # reused: no build
    assert (again.sha256, again.file_name) == (first.sha256, first.file_name)
    assert os.path.dirname(again.local_file) == str(tmp_path / "out2")
    # files the build leaves out (caches, outputs) change nothing
    (src / "proj" / "__pycache__").mkdir()
    (src / "proj" / "__pycache__" / "task.cpython-311.pyc").write_bytes(b"x")
    assert _build(src, tmp_path, 3).sha256 == first.sha256 and len(builds) == 1
    # an edit of the same size, with the same mtime, is still an edit
    stamp = os.stat(src / "proj" / "task.py").st_mtime_ns
    (src / "proj" / "task.py").write_text("VALUE = 2\n")
    os.utime(src / "proj" / "task.py", ns=(stamp, stamp))
    edited = _build(src, tmp_path, 4)
    assert len(builds) == 2 and edited.sha256 != first.sha256
    assert _member(edited, "proj/task.py") == "VALUE = 2\n"
    # back to the first contents: the first sdist, reused
    (src / "proj" / "task.py").write_text("VALUE = 1\n")
    assert _build(src, tmp_path, 5).sha256 == first.sha256 and len(builds) == 2


@pytest.mark.slow  # several real builds
def test_setup_files_added_removed_renamed_and_modes_each_rebuild(tmp_path, builds):
    src = _project(tmp_path / "src")
    _build(src, tmp_path, 0)
    steps = [
        lambda: (src / "setup.py").write_text(
            (src / "setup.py").read_text().replace("'1.0'", "'1.1'")),
        lambda: (src / "proj" / "extra.py").write_text("X = 1\n"),
        lambda: (src / "proj" / "extra.py").rename(src / "proj" / "other.py"),
        lambda: (src / "proj" / "other.py").chmod(0o755),
    ]
    for n, step in enumerate(steps, 1):
        step()
        built = _build(src, tmp_path, n)
        assert len(builds) == n + 1, f"step {n} reused a stale sdist"
    assert built.file_name == "proj-1.1.tar.gz"
    with tarfile.open(built.local_file) as tar:
        assert tar.getmember(f"{built.top_dir}/proj/other.py").mode & 0o100
    (src / "proj" / "other.py").unlink()  # as after the first step: that sdist again
    assert _build(src, tmp_path, 9).file_name == "proj-1.1.tar.gz" and len(builds) == 5


@pytest.mark.slow  # several real builds
def test_a_pyproject_change_and_a_backend_setting_rebuild(tmp_path, builds, monkeypatch):
    src = tmp_path / "src"
    (src / "proj").mkdir(parents=True)
    (src / "proj" / "__init__.py").write_text("")
    text = ('[build-system]\nrequires = ["setuptools>=61"]\n'
            'build-backend = "setuptools.build_meta"\n'
            '[project]\nname = "proj"\nversion = "{}"\n')
    (src / "pyproject.toml").write_text(text.format("1.0"))
    first = _build(src, tmp_path, 1)
    assert _build(src, tmp_path, 2).sha256 == first.sha256 and len(builds) == 1
    (src / "pyproject.toml").write_text(text.format("2.0"))
    assert _build(src, tmp_path, 3).file_name == "proj-2.0.tar.gz" and len(builds) == 2
    monkeypatch.setenv("SETUPTOOLS_SCM_PRETEND_VERSION", "9.9")
    _build(src, tmp_path, 4)
    assert len(builds) == 3


@pytest.mark.slow  # several real builds
def test_a_kept_sdist_that_changed_is_not_used(tmp_path, builds):
    src = _project(tmp_path / "src")
    first = _build(src, tmp_path, 1)
    [entry] = [e for e in os.scandir(sdist_cache.root()) if not e.name.startswith(".")]
    kept = os.path.join(entry.path, first.file_name)
    # replace the kept archive with another one (a planted or half-written entry)
    with tarfile.open(kept, "w:gz") as tar:
        tar.add(str(src / "setup.py"), arcname=f"{first.top_dir}/setup.py")
    again = _build(src, tmp_path, 2)
    assert len(builds) == 2 and again.sha256 == first.sha256
    assert _member(again, "proj/task.py") == "VALUE = 1\n"
    # a record naming another key is not used either
    record = os.path.join(entry.path, sdist_cache.RECORD)
    with open(record) as f:
        data = json.load(f)
    with open(record, "w") as f:
        json.dump({**data, "key": "0" * 64}, f)
    assert _build(src, tmp_path, 3).sha256 == first.sha256 and len(builds) == 3
    # an entry writable by everyone is not used
    os.chmod(entry.path, 0o777)
    _build(src, tmp_path, 4)
    assert len(builds) == 4


def test_an_edit_during_the_build_is_kept_under_its_own_contents(tmp_path, builds,
                                                                 monkeypatch):
    """The key of a kept sdist is taken from the build's copy: a file edited after the
    cache was looked up, before the copy, is not kept under its old contents."""
    src = _project(tmp_path / "src")
    real_copy = package._copy

    def edit_then_copy(folder, dest, exclude):
        (src / "proj" / "task.py").write_text("VALUE = 3\n")
        real_copy(folder, dest, exclude)

    monkeypatch.setattr(package, "_copy", edit_then_copy)
    assert _member(_build(src, tmp_path, 1), "proj/task.py") == "VALUE = 3\n"
    monkeypatch.setattr(package, "_copy", real_copy)
    (src / "proj" / "task.py").write_text("VALUE = 1\n")  # the contents looked up first
    assert _member(_build(src, tmp_path, 2), "proj/task.py") == "VALUE = 1\n"
    assert len(builds) == 2
    (src / "proj" / "task.py").write_text("VALUE = 3\n")
    assert _member(_build(src, tmp_path, 3), "proj/task.py") == "VALUE = 3\n"
    assert len(builds) == 2  # that build was kept under what it held


@pytest.mark.slow  # several real builds
def test_off_a_dry_run_and_a_bare_package_folder(tmp_path, builds, monkeypatch):
    folder = tmp_path / "project" / "trainer"
    folder.mkdir(parents=True)
    (folder / "task.py").write_text("X = 1\n")
    _build(folder, tmp_path, 1, keep=False)  # a dry run: nothing kept
    assert not os.path.exists(sdist_cache.root()) or not os.listdir(sdist_cache.root())
    first = _build(folder, tmp_path, 2)
    assert _build(folder, tmp_path, 3).sha256 == first.sha256 and len(builds) == 2
    (folder / "task.py").write_text("X = 2\n")
    assert _build(folder, tmp_path, 4).sha256 != first.sha256 and len(builds) == 3
    monkeypatch.setenv(sdist_cache.CACHE_ENV, "0")
    _build(folder, tmp_path, 5)
    assert len(builds) == 4
    monkeypatch.setenv(sdist_cache.CACHE_ENV, str(tmp_path / "elsewhere"))
    _build(folder, tmp_path, 6)
    _build(folder, tmp_path, 7)
    assert len(builds) == 5 and len(os.listdir(tmp_path / "elsewhere")) == 1


def test_the_oldest_entries_go_beyond_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(sdist_cache, "MAX_ENTRIES", 2)
    root = tmp_path / "cache"
    monkeypatch.setenv(sdist_cache.CACHE_ENV, str(root))
    archive = tmp_path / "a-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(str(tmp_path), arcname="a-1.0", recursive=False)
    from submit.packaging.archives import describe
    pkg = describe(str(archive))
    for i, key in enumerate(("1" * 64, "2" * 64, "3" * 64)):
        sdist_cache.store(key, pkg)
        os.utime(root / key, (i, i))
    assert sorted(os.listdir(root)) == ["2" * 64, "3" * 64]
    assert sdist_cache.lookup("2" * 64, str(tmp_path / "out")).sha256 == pkg.sha256


def test_a_cache_that_cannot_be_written_never_fails_the_build(tmp_path, builds,
                                                              monkeypatch):
    """MLJOB_SDIST_CACHE naming a file: the sdist is built each time, nothing is kept."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(sdist_cache.CACHE_ENV, str(tmp_path / "a-file"))
    src = _project(tmp_path / "src")
    assert _build(src, tmp_path, 1).file_name == "proj-1.0.tar.gz"
    assert _build(src, tmp_path, 2).file_name == "proj-1.0.tar.gz"
    assert len(builds) == 2 and (tmp_path / "a-file").read_text() == ""


def test_a_dry_run_keeps_no_sdist(tmp_path, capsys, builds):
    """The package and mljob's core (every replica's launcher) are built to be shown,
    and neither is kept."""
    from tests.support.submit_cli import dry_run, write_package
    pkg = write_package(tmp_path / "pkg")
    dry_run(capsys, "job1", "--job-dir", str(tmp_path / "j"), "--package-path", pkg,
            "--module-name", "fakejob.task")
    assert builds == [pkg, "mljob's core"] and not os.path.exists(sdist_cache.root())
