"""Packages: unsafe archives are refused, environments are built atomically and reused,
and a staged package that changed after staging is refused."""
from __future__ import annotations

import io
import os
import tarfile
import threading

import pytest

from submit import package
from submit.errors import PackageError, PackageUsageError


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


def test_environment_is_built_once_even_when_raced(tmp_path):
    archive = make_tar(tmp_path / "pkg-1.0.tar.gz", GOOD)
    sha, top = package.content_hash(archive)
    home = str(tmp_path / "home")
    results, errors = [], []

    def build():
        try:
            results.append(package.ensure_environment(archive, sha, top, home=home))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    roots = {root for root, _ in results}
    assert roots == {os.path.join(home, "envs", sha, "src", "pkg-1.0")}
    assert sorted(created for _, created in results) == [False, False, False, True]
    assert os.listdir(os.path.join(home, "envs")) == [sha]  # no temporary leftovers
    again = package.ensure_environment(archive, sha, top, home=home)
    assert again == (roots.pop(), False)


def test_an_interrupted_build_is_not_an_environment(tmp_path):
    archive = make_tar(tmp_path / "pkg-1.0.tar.gz", GOOD)
    sha, top = package.content_hash(archive)
    home = tmp_path / "home"
    (home / "envs" / f".tmp-{sha[:12]}-dead").mkdir(parents=True)  # a killed build
    root, created = package.ensure_environment(archive, sha, top, home=str(home))
    assert created and os.path.isfile(os.path.join(root, "setup.py"))


def test_a_package_changed_after_staging_is_refused(tmp_path):
    archive = make_tar(tmp_path / "pkg-1.0.tar.gz", GOOD)
    sha, top = package.content_hash(archive)
    make_tar(archive, GOOD[:2])  # replaced in the staging bucket
    with pytest.raises(PackageError, match="changed since it was staged"):
        package.ensure_environment(archive, sha, top, home=str(tmp_path / "home"))
    assert not (tmp_path / "home" / "envs" / sha).exists()


def test_a_staged_package_with_an_escaping_member_never_becomes_an_environment(tmp_path):
    archive = make_tar(tmp_path / "pkg-1.0.tar.gz",
                       GOOD + [("pkg-1.0/../../evil.py", "file", "boom")])
    sha, top = package.content_hash(archive)
    with pytest.raises(PackageUsageError, match="escapes its folder"):
        package.ensure_environment(archive, sha, top, home=str(tmp_path / "home"))
    assert os.listdir(tmp_path / "home" / "envs") == []
    assert not (tmp_path / "evil.py").exists()
